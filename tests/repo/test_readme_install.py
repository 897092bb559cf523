"""The README's install section names what the build writes, per stack and route (issue 18).

Each command the section shows is compared with what the code makes: the pip line the build
prints and writes atop constraints.txt (``package.publish.install_command``), the AOT
wheel's folder and file name (``aot.pipeline.default_out``, ``aot.wheel``), the plugin
wheel's folder and name, and, for a FlashInfer used as published, the shim requirement the
AOT wheel declares.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from packaging.version import Version

from sm120fork.aot import lookup, pipeline, wheel
from sm120fork.declare import Stack
from sm120fork.package.publish import install_command
from sm120fork.patch.series import load_series
from sm120fork.plugin import package as plugin_package
from sm120fork.plugin.build import FRAMEWORK_SINCE, PLUGIN_DIR
from sm120fork.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]
WS = Workspace(REPO)
#: The stacks the install section covers: every stack with an SGLang.
STACKS = sorted(name for name, stack in WS.stacks().items()
                if any(p.key == "sglang" for p in stack.projects))


def _section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("### What each install needs, per stack")
    return text[start:text.index("\n### ", start + 1)]


def _rows(stack: str) -> dict[str, list[str]]:
    """The table under ``**Stack `<stack>`**``: route -> [without AOT, with AOT]."""
    part = _section().split(f"**Stack `{stack}`**", 1)[1]
    table = part.split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _builds(stack: Stack) -> list[Any]:
    """One build per wheel the stack publishes: a repacked wheel per pinned file of a
    ``wheel`` source with a series, one wheel otherwise."""
    out: list[Any] = []
    for project in stack.projects:
        count = len(project.wheels) if project.source == "wheel" and project.wheels else 1
        out += [SimpleNamespace(distribution=project.distribution)] * count
    return out


@pytest.mark.parametrize("name", STACKS)
def test_the_patched_wheels_line_is_the_one_the_build_writes(name: str) -> None:
    stack = WS.stack(name)
    line = install_command(WS, WS.stack_wheels(name), cast(Any, _builds(stack)))
    without, with_aot = _rows(name)["patched wheels"]
    assert f"`{line}" in without
    assert line in with_aot or with_aot.startswith("that line, then ")


@pytest.mark.parametrize("name", STACKS)
def test_the_aot_wheel_named_is_the_file_build_aot_writes(name: str) -> None:
    stack = WS.stack(name)
    flashinfer = stack.project("flashinfer")
    cells = " ".join(cell for row in _rows(name).values() for cell in row[1:])
    (named,) = set(re.findall(r"wheels/aot/\S+?\.whl", cells))
    folder = pipeline.default_out(WS, stack).relative_to(REPO).as_posix()
    assert named.rsplit("/", 1)[0] == folder
    published = not load_series(WS.series_dir(flashinfer)).patches
    version = flashinfer.version if published else f"{flashinfer.version}+{flashinfer.local_label}"
    written = f"{wheel.PACKAGE}-{wheel.wheel_version(version, '13.0')}-py3-none-linux_x86_64.whl"
    assert fnmatch.fnmatch(written, named.rsplit("/", 1)[1])
    shim = f"{lookup.JIT_CACHE_PROVIDERS.through}=={wheel.wheel_version(version, '13.0')}"
    index = str(lookup.JIT_CACHE_PROVIDERS.through_index).format(cuda="130")
    if published:  # 0.7.x as published finds it only through upstream's shim, at that version
        assert f"--index-url {index} {shim}" in cells
        assert f"--no-deps {named}" in cells
    else:
        assert "flashinfer-jit-cache==" not in cells


@pytest.mark.parametrize("name", STACKS)
def test_the_plugin_route_names_the_plugin_wheel_or_says_why_not(name: str) -> None:
    sglang = WS.stack(name).project("sglang")
    without, with_aot = _rows(name)["stock SGLang + plugin"]
    if Version(sglang.version) < FRAMEWORK_SINCE:
        assert without.startswith("not available: SGLang")
        return
    wheel_glob = (f"{WS.stack_wheels(name).relative_to(REPO).as_posix()}/{PLUGIN_DIR}/"
                  f"{plugin_package.IMPORT_PACKAGE}-*.whl")
    assert f"pip install sglang=={sglang.version} {wheel_glob}" in without
    written = (f"{plugin_package.IMPORT_PACKAGE}-{sglang.version}+{sglang.local_label}"
               "-py3-none-any.whl")
    assert fnmatch.fnmatch(written, wheel_glob.rsplit("/", 1)[1])
    assert with_aot.startswith("that line, then ")  # the AOT wheel as in the other route
