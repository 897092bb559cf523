"""Stack flashinfer-0.7.4 from the package index: its FlashInfer build beside the companion
packages of the release it is made from (network, ~1-2 min)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.cli.main import main
from sm120fork.verify.proof.patches import VERIFY_STACK_ENV

from helpers_flashinfer import cubin_stand_in, install_flashinfer, put_upstream_file
from helpers_ws import checkout_copy

#: The stack verify-sm120 runs a claim's test for (a copy under another name builds its
#: own series), else flashinfer-0.7.4.
STACK = os.environ.get(VERIFY_STACK_ENV) or "flashinfer-0.7.4"
pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.runs_stack(STACK)]
RELEASE = "0.7.4"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = checkout_copy(tmp_path_factory.mktemp("e2e"))
    assert main(["--root", str(root), "build", "--stack", STACK]) == 0
    return root


# flashinfer.jit.env from the site in argv[1] without flashinfer/__init__ (GPU-heavy): the
# cubin folder it chose at import, and which flashinfer-jit-cache versions (argv[2:]) it
# accepts for this flashinfer.
_ENV_PROBE = r"""
import importlib, json, sys, types
site = sys.argv[1]
sys.path.insert(0, site)
module = types.ModuleType("flashinfer")
module.__path__ = [site + "/flashinfer"]
sys.modules["flashinfer"] = module
env = importlib.import_module("flashinfer.jit.env")
accepted = {}
for version in sys.argv[2:]:
    try:
        env._check_jit_cache_version("flashinfer-jit-cache", version)
        accepted[version] = True
    except RuntimeError:
        accepted[version] = False
print(json.dumps({"cubin_dir": str(env.FLASHINFER_CUBIN_DIR), "jit_cache": accepted}))
"""


def _probe(site: Path, tmp_path: Path, caches: list[str]) -> tuple[dict[str, object], str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1",
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")}
    done = subprocess.run([sys.executable, "-c", _ENV_PROBE, str(site), *caches],
                          capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_our_flashinfer_takes_the_companion_packages_of_its_release(
        built: Path, tmp_path: Path) -> None:
    """Patch 0001: our 0.7.4+sm120.1 uses flashinfer-cubin 0.7.4 and accepts
    flashinfer-jit-cache 0.7.4+cu130 (same public version), and still refuses another
    release's; upstream's env.py ignores that flashinfer-cubin (cubins then downloaded on
    demand) and refuses that jit-cache for our local-label version."""
    pytest.importorskip("torch")  # flashinfer.compilation_context imports it
    site = tmp_path / "site"
    version = install_flashinfer(built, STACK, site)
    assert version == f"{RELEASE}+sm120.1"
    cubins = cubin_stand_in(site, RELEASE)
    caches = [f"{RELEASE}+cu130", f"{RELEASE}+cu129", "0.7.3+cu130", "0.7.5"]
    ours, log = _probe(site, tmp_path, caches)
    assert ours["cubin_dir"] == str(cubins), log[-2000:]
    assert ours["jit_cache"] == {f"{RELEASE}+cu130": True, f"{RELEASE}+cu129": True,
                                 "0.7.3+cu130": False, "0.7.5": False}
    assert "Ignoring incompatible flashinfer-cubin" not in log

    put_upstream_file(built, STACK, site, "flashinfer/jit/env.py")
    theirs, log = _probe(site, tmp_path, caches)
    assert theirs["cubin_dir"] != str(cubins)
    assert "Ignoring incompatible flashinfer-cubin" in log
    assert theirs["jit_cache"] == dict.fromkeys(caches, False)
