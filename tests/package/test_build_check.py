"""``build`` checks the patched tree before it publishes (issue 41).

A stack whose merged patch used a name its release does not have was built and published;
``status`` said "applies: yes".  The build now compiles every Python file the series
touches and imports the patched modules under the fake-GPU probe first: it refuses,
naming patch, ``file:line`` and the error, unless told ``--unchecked``, which the
manifest and ``status`` then say.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from sm120fork.cli.main import main
from sm120fork.errors import BuildError
from sm120fork.maintain.status import status
from sm120fork.manifest import UNCHECKED
from sm120fork.package.stack import build_stack
from sm120fork.verify.proof.stack import run_verify

from conftest import make_patch, write_series
from helpers_ws import STACK, DemoWorkspace, make_demo

pytestmark = pytest.mark.slow


@pytest.fixture
def broken(tmp_path: Path) -> tuple[DemoWorkspace, str]:
    """The demo stack with a third lib patch that applies but fails at import."""
    demo = make_demo(tmp_path)
    lib_dir = demo.series_dir("lib")
    p = make_patch(demo.lib.repo, lib_dir, "S9 limits: scale with the default", {
        "demo_lib/__init__.py": ("def supported",
                                 "LIMIT = DEFAULT * 2  # sm12x\n\n\ndef supported")},
        "demo_lib/__init__.py: LIMIT = DEFAULT * 2  # sm12x")
    write_series(lib_dir, [*(lib_dir / "series").read_text().split(), p.name])
    return demo, p.name


def test_build_refuses_a_tree_that_fails_its_check(broken: tuple[DemoWorkspace, str]) -> None:
    demo, name = broken
    with pytest.raises(BuildError) as err:
        build_stack(demo.ws, demo.ws.stack(STACK))
    assert err.value.what == (f"patch {name} fails its check: NameError: name 'DEFAULT' is "
                              "not defined (import demo_lib at capability 12.0)")
    assert err.value.where == "demo_lib/__init__.py:3"
    assert f"--stack {STACK} --unchecked`" in (err.value.fix or "")
    assert "refresh demo lib`" in (err.value.fix or "")
    assert not demo.ws.stack_wheels(STACK).exists()


def test_unchecked_publishes_and_the_manifest_and_status_say_so(
        broken: tuple[DemoWorkspace, str]) -> None:
    demo, name = broken
    root = ["--root", str(demo.ws.root)]
    assert main([*root, "build", "--stack", STACK, "--unchecked"]) == 0
    manifest = json.loads((demo.ws.stack_wheels(STACK) / "manifest.json").read_text())
    checks = {w["project"]: w["check"] for w in manifest["wheels"]}
    assert checks["lib"] == (f"{UNCHECKED}: fails its check: {name}: demo_lib/__init__.py:3: "
                             "NameError: name 'DEFAULT' is not defined (import demo_lib at "
                             "capability 12.0)")
    assert checks["app"].startswith("compiled 1 Python file(s) the series touches; imported 1")
    lib = next(ps for ps in status(demo.ws) if ps.project == "lib")
    assert all(p.wheel.endswith("(built unchecked)") for p in lib.patches)
    # A build that checks does not take the unchecked wheel from the cache.
    assert main([*root, "build", "--stack", STACK]) == BuildError.exit_code


def test_verify_names_the_patch_and_its_error_not_the_probes_requirements(
        broken: tuple[DemoWorkspace, str]) -> None:
    """verify-sm120 met the NameError in its probe and advised "install the probe's
    requirements and its overlay"; it builds first, and the build's check names it."""
    demo, name = broken
    with pytest.raises(BuildError) as err:
        run_verify(demo.ws, demo.ws.stack(STACK))
    assert err.value.what.startswith(f"patch {name} fails its check: NameError")
    assert err.value.where == "demo_lib/__init__.py:3"
    assert "requirements" not in str(err.value)


def test_the_refusals_steps_mend_the_patch_when_pasted(
        broken: tuple[DemoWorkspace, str]) -> None:
    """The trial followed "commit the fix in <tree>, then refresh": a commit of its own,
    which refresh exports as a new patch, the broken one left as it was.  The steps now
    fold the fix into the patch's own commit; pasted, refresh mends that patch."""
    demo, name = broken
    with pytest.raises(BuildError) as err:
        build_stack(demo.ws, demo.ws.stack(STACK))
    tree = demo.ws.trees_dir / STACK / "lib"
    init = tree / "demo_lib" / "__init__.py"
    init.write_text(init.read_text().replace("LIMIT = ", "DEFAULT = 4\nLIMIT = "))
    for pasted in re.findall(r"`(git [^`]+)`", err.value.fix or ""):
        subprocess.run(shlex.split(pasted), check=True, capture_output=True)
    before = (demo.series_dir("lib") / "series").read_text()
    assert main(["--root", str(demo.ws.root), "refresh", STACK, "lib"]) == 0
    assert (demo.series_dir("lib") / "series").read_text() == before
    assert "+DEFAULT = 4\n+LIMIT = DEFAULT * 2" in (demo.series_dir("lib") / name).read_text()
    build_stack(demo.ws, demo.ws.stack(STACK))
