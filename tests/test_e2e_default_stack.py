"""The real default stack from the package index, end to end (network, ~1-2 min)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from sm120fork.cli.main import main

from conftest import git
from helpers_ws import checkout_copy

pytestmark = [pytest.mark.network, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
STACK_WHEELS = Path("wheels", "sglang-0.5.10")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = checkout_copy(tmp_path_factory.mktemp("e2e"))
    assert main(["--root", str(root), "build"]) == 0
    return root


def test_wheels_install_and_carry_the_patched_gates(built: Path, tmp_path: Path) -> None:
    wheels = sorted((built / STACK_WHEELS).glob("*.whl"))
    assert [w.name for w in wheels] == [
        "flashinfer_python-0.6.7.post3+sm120.1-py3-none-any.whl",
        "sglang-0.5.10.post1+sm120.1-py3-none-any.whl"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", "--target", str(target),
                    "-c", str(built / STACK_WHEELS / "constraints.txt"), *map(str, wheels)],
                   check=True)
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('flashinfer-python'), "
         "m.version('sglang'))"], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["0.6.7.post3+sm120.1", "0.5.10.post1+sm120.1"]
    comm = (target / "sglang" / "srt" / "layers" / "communicator.py").read_text()
    assert "is_sm120_supported" in comm.split("def apply_flashinfer_allreduce_fusion")[1][:800]
    meta = (target / "flashinfer" / "_build_meta.py").read_text()
    assert '__version__ = "0.6.7.post3+sm120.1"' in meta
    manifest = json.loads((built / STACK_WHEELS / "manifest.json").read_text())
    for entry in manifest["wheels"]:
        assert entry["artifact_check"]
        assert all(r["passed"] for r in entry["artifact_check"])
        assert len(entry["patches"]) >= 1


def test_sglang_requirement_resolves_to_our_flashinfer(built: Path) -> None:
    from packaging.requirements import Requirement
    from packaging.version import Version

    wheel = next((built / STACK_WHEELS).glob("sglang-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("sglang-0.5.10.post1+sm120.1.dist-info/METADATA").decode()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines()
            if line.startswith("Requires-Dist: flashinfer")]
    fi = next(r for r in reqs if r.name == "flashinfer_python")
    assert fi.specifier.contains(Version("0.6.7.post3+sm120.1"))
    assert not fi.specifier.contains(Version("0.6.8"))


def test_git_source_from_a_repo_made_of_the_real_sdist(built: Path, tmp_path: Path) -> None:
    """The git source kind gives the same patched tree as the sdist kind."""
    sdist = built / ".forks" / "cache" / "sdists" / "flashinfer_python-0.6.7.post3.tar.gz"
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path, filter="data")
    upstream = tmp_path / "flashinfer_python-0.6.7.post3"
    git(upstream, "init", "-q", "-b", "main")
    git(upstream, "add", "-A", "--force", ".")
    git(upstream, "commit", "-q", "-m", "v0.6.7.post3 (from the sdist)")
    sha = git(upstream, "rev-parse", "HEAD")
    toml = built / "forks" / "sglang-0.5.10.toml"
    original = toml.read_text()
    toml.write_text(original.replace('source = "sdist"', 'source = "git"', 1)
                    .replace("https://github.com/flashinfer-ai/flashinfer.git", str(upstream))
                    .replace("f499b1f0c618ed6583865bc4b97812fb8e3f2ef1", sha))
    try:
        assert main(["--root", str(built), "build", "--force"]) == 0
        manifest = json.loads((built / STACK_WHEELS / "manifest.json").read_text())
    finally:
        toml.write_text(original)
    fi = manifest["wheels"][0]
    assert fi["source"]["kind"] == "git"
    assert fi["source"]["digest"] == sha
    work = built / ".forks" / "trees" / "sglang-0.5.10" / "flashinfer"
    assert git(work, "rev-parse", "upstream") == sha
    # Same content as the sdist-based tree: identical patched tree hash.
    assert main(["--root", str(built), "build", "--force"]) == 0
    sdist_manifest = json.loads((built / STACK_WHEELS / "manifest.json").read_text())
    assert sdist_manifest["wheels"][0]["tree"] == fi["tree"]


# Imports flashinfer submodules from the site in argv[1] without flashinfer/__init__ (GPU-heavy).
_FLASHINFER_SITE = r"""
import importlib, json, sys, types
from pathlib import Path
site = Path(sys.argv[1])
sys.path.insert(0, str(site))
for name in ("flashinfer", "flashinfer.jit"):  # skip flashinfer/__init__ (GPU-heavy imports)
    module = types.ModuleType(name)
    module.__path__ = [str(site.joinpath(*name.split(".")))]
    sys.modules[name] = module
"""

_ENV_PROBE = _FLASHINFER_SITE + r"""
env = importlib.import_module("flashinfer.jit.env")
print("cubin dir:", env.FLASHINFER_CUBIN_DIR)
"""


def _cubin_stand_in(site: Path) -> None:
    """flashinfer_cubin as SGLang pins it: only what FlashInfer's version check reads."""
    pkg = site / "flashinfer_cubin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '__version__ = "0.6.7.post3"\n\ndef get_cubin_dir():\n    return __file__ + "/cubins"\n')


def test_flashinfer_imports_beside_the_pinned_flashinfer_cubin(built: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")  # flashinfer.compilation_context imports it
    site = tmp_path / "site"
    wheel = next((built / STACK_WHEELS).glob("flashinfer_python-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)],
                   check=True)
    _cubin_stand_in(site)
    ours = subprocess.run([sys.executable, "-c", _ENV_PROBE, str(site)], capture_output=True,
                          text=True, check=False)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert "flashinfer_cubin" in ours.stdout
    # The same check with upstream's env.py refuses our local-label version: patch 0001.
    work = built / ".forks" / "trees" / "sglang-0.5.10" / "flashinfer"
    (site / "flashinfer" / "jit" / "env.py").write_text(
        git(work, "show", "upstream:flashinfer/jit/env.py") + "\n")
    theirs = subprocess.run([sys.executable, "-c", _ENV_PROBE, str(site)], capture_output=True,
                            text=True, check=False)
    assert theirs.returncode != 0
    assert "does not match" in theirs.stderr


_PREBUILT_PROBE = _FLASHINFER_SITE + r"""
comm = importlib.import_module("flashinfer.jit.comm")
spec = comm.gen_trtllm_comm_module()
print(json.dumps({"name": spec.name, "aot": spec.is_aot,
                  "library": str(spec.get_library_path())}))
"""


def _jit_cache_stand_in(site: Path) -> Path:
    """A stock flashinfer-jit-cache 0.6.7.post3 holding a prebuilt trtllm_comm module."""
    pkg = site / "flashinfer_jit_cache"
    (pkg / "jit_cache" / "trtllm_comm").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        '__version__ = "0.6.7.post3+cu130"\n\nfrom pathlib import Path\n\n'
        'def get_jit_cache_dir():\n    return str(Path(__file__).parent / "jit_cache")\n')
    so = pkg / "jit_cache" / "trtllm_comm" / "trtllm_comm.so"
    so.write_bytes(b"\x7fELF not built from our sources")
    return so


def _probe_prebuilt(site: Path, tmp_path: Path) -> tuple[dict[str, object], str]:
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", _PREBUILT_PROBE, str(site)],
                          capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_stock_jit_cache_module_is_not_loaded_but_ours_is(built: Path, tmp_path: Path) -> None:
    """Patch 0002: beside a stock flashinfer-jit-cache our build JIT-compiles trtllm_comm
    from its own patched sources; a module carrying our sources digest is loaded."""
    pytest.importorskip("torch")  # flashinfer.compilation_context imports it
    site = tmp_path / "site"
    wheel = next((built / STACK_WHEELS).glob("flashinfer_python-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)],
                   check=True)
    stock = _jit_cache_stand_in(site)

    ours, stderr = _probe_prebuilt(site, tmp_path)
    assert ours["name"] == "trtllm_comm"
    assert ours["aot"] is False
    assert Path(str(ours["library"])) != stock
    assert "cached_ops" in Path(str(ours["library"])).parts
    refusals = [line for line in stderr.splitlines() if "not loading prebuilt" in line]
    assert len(refusals) == 1, stderr[-3000:]
    assert "trtllm_comm" in refusals[0]
    assert "JIT-compiling it instead" in refusals[0]

    # A module recorded as built from exactly these sources is accepted...
    import importlib.util

    where = site / "flashinfer" / "jit" / "provenance.py"
    loader = importlib.util.spec_from_file_location("fi_provenance", where)
    assert loader is not None
    assert loader.loader is not None
    provenance = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(provenance)
    data = site / "flashinfer" / "data"
    provenance.write_marker(stock, data / "csrc", data / "include")
    accepted, stderr = _probe_prebuilt(site, tmp_path)
    assert accepted["aot"] is True
    assert Path(str(accepted["library"])) == stock
    assert "not loading prebuilt" not in stderr
    # ... and one built from other sources (another digest) is not.
    marker = stock.with_name(stock.name + ".sources")
    marker.write_text("sha256:" + "0" * 64 + "\n")
    other, stderr = _probe_prebuilt(site, tmp_path)
    assert other["aot"] is False
    assert "records sha256:0000" in stderr

    # Upstream's loader takes the stock module (the bug patch 0002 fixes).
    marker.unlink()
    work = built / ".forks" / "trees" / "sglang-0.5.10" / "flashinfer"
    (site / "flashinfer" / "jit" / "core.py").write_text(
        git(work, "show", "upstream:flashinfer/jit/core.py") + "\n")
    theirs, _ = _probe_prebuilt(site, tmp_path)
    assert theirs["aot"] is True
    assert Path(str(theirs["library"])) == stock
