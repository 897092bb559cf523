"""Stack sglang-0.5.23's AOT route: FlashInfer 0.7.2 as published, on the stack's torch.

FlashInfer 0.7.2 finds prebuilt modules of another distribution only as providers of
upstream's ``flashinfer-jit-cache`` shim (served on FlashInfer's index, not on PyPI).  The
shim here is a stand-in that follows its documented contract (entry point group
``flashinfer.jit_cache.providers``, manifest schema 1); everything else is the published
FlashInfer 0.7.2 and the real torch with the stack's version strings.  No GPU: the target
comes from ``FLASHINFER_CUDA_ARCH_LIST`` (as on an SM120 / SM121 box) and loading the file
is tvm-ffi's ``load_module``, replaced by a recorder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from sm120fork.aot import check, wheel
from sm120fork.declare import load_stacks
from sm120fork.util import wire

REPO = Path(__file__).resolve().parents[2]
#: sglang 0.5.23 pins torch==2.14.1; that torch on the package index is the CUDA 13.0 build
#: (Requires-Dist cuda-toolkit[cudart,...]==13.0.3), so torch.version.cuda is 13.0 and it
#: brings libcudart.so.13, which the module links.
STACK_TORCH = ("2.14.1", "13.0")

_SHIM = '''"""Stand-in for upstream's flashinfer-jit-cache shim: its provider contract."""
import importlib.metadata
import types
from pathlib import Path

__version__ = "{version}"


def get_jit_cache_providers():
    found = []
    for entry_point in importlib.metadata.entry_points(group="flashinfer.jit_cache.providers"):
        manifest = entry_point.load()()
        assert manifest["schema_version"] == 1
        found.append(types.SimpleNamespace(
            provider_id=entry_point.name, distribution=manifest["distribution"],
            version=manifest["version"], jit_cache_dir=Path(manifest["jit_cache_dir"]),
            cuda_architectures=frozenset(manifest["cuda_architectures"]),
            modules=frozenset(manifest["modules"])))
    return tuple(found)
'''

_PROBE = r"""
import importlib, json, sys, types
from pathlib import Path
import torch
torch.__version__, torch.version.cuda = sys.argv[2], sys.argv[3]
root = Path(sys.argv[1]) / "flashinfer"
for name in ("flashinfer", "flashinfer.jit"):
    module = types.ModuleType(name)
    module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
    sys.modules[name] = module
import tvm_ffi
loaded = []
tvm_ffi.load_module = lambda path: loaded.append(path) or "module"
comm = importlib.import_module("flashinfer.jit.comm")
spec = comm.gen_trtllm_comm_module()
out = {"aot": spec.is_aot, "library": str(spec.get_library_path())}
if spec.is_aot:
    spec.build_and_load()  # FlashInfer's own path: try_load, no JIT (FLASHINFER_DISABLE_JIT)
out["loaded"] = loaded
print(json.dumps(out))
"""


def _pip_target(target: Path, *wheels: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(target),
                    *map(str, wheels)], check=True)


def _shim(site: Path, version: str) -> None:
    (site / "flashinfer_jit_cache").mkdir(parents=True)
    (site / "flashinfer_jit_cache" / "__init__.py").write_text(_SHIM.format(version=version))
    info = site / f"flashinfer_jit_cache-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {version}\n")


def _index_metadata(tmp: Path, requirement: str) -> dict[str, Any]:
    """The metadata the package index gives for ``requirement`` (cp311, x86_64), no download
    of the wheel itself."""
    tmp.mkdir(parents=True, exist_ok=True)
    report = tmp / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-deps",
                    "--ignore-installed", "--only-binary=:all:", "--python-version", "3.11",
                    "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64",
                    "--target", str(tmp / "t"),
                    "--disable-pip-version-check", "--report", str(report), requirement],
                   check=True)
    metadata: dict[str, Any] = json.loads(report.read_text())["install"][0]["metadata"]
    return metadata


@pytest.mark.network
def test_the_stacks_torch_is_the_cuda_13_0_build(tmp_path: Path) -> None:
    """sglang 0.5.23 pins the torch the CPU test below stands in for, and that torch on the
    index is built for CUDA 13.0, whose runtime (libcudart.so.13) the module links."""
    stack = load_stacks(REPO / "forks")["sglang-0.5.23"]
    sglang = _index_metadata(tmp_path / "s", f"sglang=={stack.project('sglang').version}")
    assert f"torch=={STACK_TORCH[0]}" in sglang["requires_dist"]
    torch = _index_metadata(tmp_path / "t", f"torch=={STACK_TORCH[0]}")
    toolkit = [r for r in torch["requires_dist"] if r.startswith("cuda-toolkit[")]
    assert len(toolkit) == 1
    assert "cudart" in toolkit[0]
    assert f"=={STACK_TORCH[1]}." in toolkit[0]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flashinfer-python 0.7.2 from the index, the file the stack pins (sha256)."""
    stack = load_stacks(REPO / "forks")["sglang-0.5.23"]
    (pin,) = stack.project("flashinfer").wheels
    dl = tmp_path_factory.mktemp("dl")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--disable-pip-version-check", "-d", str(dl),
                    f"flashinfer-python=={stack.project('flashinfer').version}"], check=True)
    got = dl / pin.filename
    from sm120fork.util.files import sha256_file
    assert sha256_file(got) == pin.sha256
    return got


@pytest.mark.network
@pytest.mark.slow
def test_flashinfer_072_as_published_finds_and_loads_the_aot_wheel_on_the_stacks_torch(
        published: Path, tmp_path: Path) -> None:
    """Issue 18.3, second half: the lookup exists without patching FlashInfer (providers of
    its jit-cache shim); with the shim at the wheel's version, 0.7.2 loads our module for
    SM120 and SM121 on torch 2.14.1 / CUDA 13.0 without nvcc; without the shim, or with a
    shim of another CUDA, it does not (so the wheel requires the shim at its own version)."""
    pytest.importorskip("torch")
    site = tmp_path / "site"
    _pip_target(site, published)
    assert wheel.of_tree(site, "sglang-0.5.23") is wheel.JIT_CACHE_PROVIDERS
    data = site / "flashinfer" / "data"
    so = tmp_path / "trtllm_comm.so"
    so.write_bytes(b"\x7fELF stand-in")
    flashinfer = wheel.FlashInferBuild(
        distribution="flashinfer-python", version="0.7.2", wheel=published.name,
        sha256="0" * 64, upstream_version="0.7.2", series_digest="e3" * 32, tree=None,
        patched_commit=None)
    ours = wheel.write_wheel(
        tmp_path / "ours", flashinfer=flashinfer, cuda_version="13.0", platform="linux_x86_64",
        modules=[wheel.Module(name="trtllm_comm", so=so, targets=("sm_90a", "sm_120f", "sm_121a"),
                              info={}, sources_digest=wheel.own_digest(
                                  data / "csrc", data / "include"))],
        stack="sglang-0.5.23", toolkit_version="0", toolchain={},
        lookup=wheel.JIT_CACHE_PROVIDERS)
    with zipfile.ZipFile(ours) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: flashinfer-jit-cache==0.7.2+cu130\n" in metadata
    theirs = tmp_path / "site-ours"
    _pip_target(theirs, ours)
    expected = theirs / "sm120fork_flashinfer_aot" / "jit_cache" / "trtllm_comm" / \
        "trtllm_comm.so"

    no_nvcc = tmp_path / "no-cuda"
    no_nvcc.mkdir()

    def probe(shim: Path | None, arch: str) -> dict[str, object]:
        path = [str(theirs), str(site)] + ([str(shim)] if shim else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "CUDA_HOME": str(no_nvcc),
               "PATH": "/usr/bin:/bin", "FLASHINFER_CUDA_ARCH_LIST": arch,
               "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "FLASHINFER_DISABLE_JIT": "1",
               "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("FLASHINFER_DISABLE_VERSION_CHECK", None)
        done = subprocess.run([sys.executable, "-c", _PROBE, str(site),
                               f"{STACK_TORCH[0]}+cu130", STACK_TORCH[1]],
                              capture_output=True, text=True, check=False, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        found["stderr"] = done.stderr
        return found

    shim = tmp_path / "shim"
    _shim(shim, "0.7.2+cu130")
    for arch in ("12.0", "12.1"):  # sm_120f (RTX PRO 6000 / RTX 50xx), sm_121a (DGX Spark)
        found = probe(shim, arch)
        assert found["aot"] is True, found
        assert Path(str(found["library"])) == expected
        assert found["loaded"] == [str(expected)]

    # The route needs the shim: without it 0.7.2 never asks for providers.
    alone = probe(None, "12.0")
    assert alone["aot"] is False
    assert alone["loaded"] == []
    # A shim of another CUDA build: FlashInfer ignores our provider, saying why.
    other = tmp_path / "shim-cu129"
    _shim(other, "0.7.2+cu129")
    mismatch = probe(other, "12.0")
    assert mismatch["aot"] is False
    assert "Ignoring incompatible flashinfer jit-cache provider" in str(mismatch["stderr"])

    # aot-check's lookup reads the same answer from the installed FlashInfer (for sm_90a:
    # on this CPU torch, with no CUDA version, 0.7.2 cannot name an SM12x target).
    env = {"PYTHONPATH": os.pathsep.join([str(theirs), str(site), str(shim)]),
           "CUDA_HOME": str(no_nvcc), "PATH": "/usr/bin:/bin",
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")}
    found_check = check.lookup(env=env, arch_list="9.0")
    assert found_check.lookup == "jit-cache-providers"
    assert check.check_installed(wheel.read_wheel(ours), found_check) == []
    env["PYTHONPATH"] = os.pathsep.join([str(theirs), str(site)])
    problems = check.check_installed(wheel.read_wheel(ours),
                                     check.lookup(env=env, arch_list="9.0"))
    assert any("install flashinfer-jit-cache==0.7.2+cu130" in p for p in problems), problems

    # The doctor's FlashInfer probe names the provider and where trtllm_comm loads from.
    from sm120fork.doctor import flashinfer_probe
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(theirs), str(site), str(shim)]),
           "CUDA_HOME": str(no_nvcc), "PATH": "/usr/bin:/bin", "FLASHINFER_CUDA_ARCH_LIST": "9.0",
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", "import sys; from sm120fork.doctor import "
                           "flashinfer_probe as p; sys.exit(p.main(['9.0']))"],
                          capture_output=True, text=True, check=True, env={
                              **env, "PYTHONPATH": env["PYTHONPATH"] + os.pathsep +
                              str(REPO / "src")})
    facts = wire.last(done.stdout, flashinfer_probe.TAG)
    assert [n for n, _ in facts["prebuilt_providers"]] == ["sm120fork"]
    assert facts["comm"]["is_aot"] is True
    assert Path(facts["comm"]["aot_path"]) == expected
