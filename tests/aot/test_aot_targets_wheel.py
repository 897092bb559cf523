"""The AOT wheel without a compiler: targets, version pin, layout, manifest, install."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sm120fork.aot import compile as targets
from sm120fork.aot import wheel
from sm120fork.errors import BuildError, ConfigError

FLASHINFER = wheel.FlashInferBuild(
    distribution="flashinfer-python", version="0.6.7.post3+sm120.1",
    wheel="flashinfer_python-0.6.7.post3+sm120.1-py3-none-any.whl", sha256="ab" * 32,
    tree="cd" * 20, patched_commit="ef" * 20, upstream_version="0.6.7.post3",
    series_digest="12" * 32)


def test_capabilities_are_validated_and_ordered() -> None:
    assert targets.parse_capabilities(["9.0", " 12.0", "9.0", "12.1"]) == ("9.0", "12.0",
                                                                            "12.1")
    assert targets.arch_list(("9.0", "12.0")) == "9.0 12.0"
    with pytest.raises(ConfigError, match="not a compute capability"):
        targets.parse_capabilities(["sm_120"])
    with pytest.raises(ConfigError, match="no compute capabilities"):
        targets.parse_capabilities([])


def test_targets_come_from_the_gencode_flags_in_order() -> None:
    flags = ["-O3", "-gencode=arch=compute_90a,code=sm_90a",
             "-gencode=arch=compute_120f,code=sm_120f", "-gencode=arch=compute_90a,code=sm_90a"]
    assert targets.targets_from_flags(flags) == ("sm_90a", "sm_120f")


def test_version_pins_the_flashinfer_build_and_passes_both_import_checks() -> None:
    version = wheel.wheel_version("0.6.7.post3+sm120.1", "13.0")
    assert version == "0.6.7.post3+sm120.1.cu130"
    assert version.startswith("0.6.7.post3+sm120.1")  # upstream's check: startswith
    assert version.split("+")[0] == "0.6.7.post3"       # patch 0001: public versions equal
    assert wheel.wheel_version("0.7.2", "12.9") == "0.7.2+cu129"
    with pytest.raises(ConfigError):
        wheel.cuda_tag("13")


def _fake_so(tmp_path: Path) -> Path:
    so = tmp_path / "trtllm_comm.so"
    so.write_bytes(b"\x7fELF fake module bytes")
    return so


def _write(tmp_path: Path) -> Path:
    module = wheel.Module(name="trtllm_comm", so=_fake_so(tmp_path),
                          targets=("sm_90a", "sm_120f"), info={"arch_list": "9.0 12.0"},
                          sources_digest="sha256:" + "0" * 64)
    return wheel.write_wheel(tmp_path / "out", flashinfer=FLASHINFER, modules=[module],
                             cuda_version="13.0", platform="linux_x86_64",
                             stack="sglang-0.5.10", toolkit_version="0.1.0",
                             toolchain={"nvcc": "V13.0.88"})


def _install(built: Path, target: Path) -> None:
    """pip-install the built wheel alone into ``target`` (no index, no dependencies)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(target), str(built)],
                   check=True)


def test_wheel_layout_metadata_and_manifest(tmp_path: Path) -> None:
    built = _write(tmp_path)
    assert built.name == ("sm120fork_flashinfer_aot-0.6.7.post3+sm120.1.cu130-py3-none-"
                          "linux_x86_64.whl")
    with zipfile.ZipFile(built) as zf:
        names = set(zf.namelist())
        metadata = zf.read("sm120fork_flashinfer_aot-0.6.7.post3+sm120.1.cu130.dist-info/"
                           "METADATA").decode()
        record = zf.read("sm120fork_flashinfer_aot-0.6.7.post3+sm120.1.cu130.dist-info/"
                         "RECORD").decode()
        entry_points = zf.read("sm120fork_flashinfer_aot-0.6.7.post3+sm120.1.cu130.dist-info/"
                               "entry_points.txt").decode()
        so_bytes = zf.read("sm120fork_flashinfer_aot/jit_cache/trtllm_comm/trtllm_comm.so")
    assert "sm120fork_flashinfer_aot/jit_cache/trtllm_comm/trtllm_comm.so" in names
    assert "sm120fork_flashinfer_aot/jit_cache/trtllm_comm/trtllm_comm.so.sources" in names
    # A name of its own: installing it never uninstalls upstream's flashinfer-jit-cache.
    assert "Name: sm120fork-flashinfer-aot" in metadata
    assert "flashinfer-jit-cache" not in metadata
    assert entry_points == ("[flashinfer.prebuilt]\n"
                            "sm120fork = sm120fork_flashinfer_aot:get_jit_cache_dir\n")
    assert "Requires-Dist: flashinfer-python==0.6.7.post3+sm120.1" in metadata
    # The module links libcudart.so.13: required, since the stack's torch may not bring it.
    assert "Requires-Dist: nvidia-cuda-runtime>=13.0,<14" in metadata
    assert "sm120fork_flashinfer_aot/jit_cache/trtllm_comm/trtllm_comm.so,sha256=" in record
    manifest = wheel.read_wheel(built)
    assert manifest.flashinfer == FLASHINFER
    assert manifest.flashinfer.version == "0.6.7.post3+sm120.1"
    entry = manifest.modules["trtllm_comm"]
    assert entry.sha256 == hashlib.sha256(so_bytes).hexdigest()
    assert entry.targets == ("sm_90a", "sm_120f")
    assert entry.sources_digest == "sha256:" + "0" * 64
    # Byte-stable: the same inputs give the same wheel.
    first = built.read_bytes()
    assert _write(tmp_path).read_bytes() == first


def test_a_tampered_module_is_caught(tmp_path: Path) -> None:
    built = _write(tmp_path)
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(built) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("trtllm_comm.so"):
                data = b"something else"
            dst.writestr(item, data)
    with pytest.raises(BuildError, match="does not match its sha256"):
        wheel.read_wheel(bad)


def test_installed_package_points_flashinfer_at_its_modules(tmp_path: Path) -> None:
    built = _write(tmp_path)
    target = tmp_path / "site"
    _install(built, target)
    out = subprocess.run(
        [sys.executable, "-c", "import json; from importlib.metadata import entry_points; "
         "(e,) = entry_points(group='flashinfer.prebuilt'); "
         "import sm120fork_flashinfer_aot as j; print(json.dumps("
         "[j.__version__, j.BUILT_BY, e.load()(), j.manifest()['version']]))"],
        check=True, capture_output=True, text=True, env={"PYTHONPATH": str(target)},
        cwd=tmp_path).stdout
    version, built_by, cache_dir, manifest_version = json.loads(out)
    assert version == manifest_version == "0.6.7.post3+sm120.1.cu130"
    assert built_by == "sm120fork"
    assert (Path(cache_dir) / "trtllm_comm" / "trtllm_comm.so").is_file()
    assert Path(cache_dir).is_relative_to(target)


def test_the_package_loads_the_cuda_runtime_from_site_packages_when_torch_did_not(
        tmp_path: Path) -> None:
    """Issue 18.3: on a torch built for CUDA 12.8 nothing has loaded libcudart.so.13, which
    the module links; the package loads it from the nvidia-cuda-runtime it requires."""
    import shutil

    real = next(iter(sorted(Path("/usr/local/cuda/lib64").glob("libcudart.so.1*"))), None) \
        if Path("/usr/local/cuda/lib64").is_dir() else None
    if real is None:
        pytest.skip("no CUDA runtime library on this machine to stand in for the package's")
    built = _write(tmp_path)
    target = tmp_path / "site"
    _install(built, target)
    probe = ("import sm120fork_flashinfer_aot as j; j.CUDA_RUNTIME = 'libsm120forktest.so.13'; "
             "print(j.load_cuda_runtime())")
    run = [sys.executable, "-c", probe]
    env = {"PYTHONPATH": str(target)}
    # Not on the search path and not in site-packages: the package says so (None).
    out = subprocess.run(run, check=True, capture_output=True, text=True, env=env).stdout
    assert out.strip() == "None"
    lib = target / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    shutil.copy(real, lib / "libsm120forktest.so.13")
    out = subprocess.run(run, check=True, capture_output=True, text=True, env=env).stdout
    assert Path(out.strip()) == (lib / "libsm120forktest.so.13").resolve()


def test_as_a_jit_cache_provider_it_returns_the_shims_manifest(tmp_path: Path) -> None:
    """For a FlashInfer 0.7.x as published: the entry point of upstream's shim returns a
    schema-1 manifest (distribution, version, jit_cache_dir, cuda_architectures, modules),
    its version the wheel's, which 0.7.2 requires to equal the shim's exactly."""

    so = tmp_path / "trtllm_comm.so"
    so.write_bytes(b"\x7fELF")
    published = wheel.FlashInferBuild(
        distribution="flashinfer-python", version="0.7.2", wheel="w.whl", sha256="ab" * 32,
        tree=None, patched_commit=None, upstream_version="0.7.2", series_digest="12" * 32)
    built = wheel.write_wheel(
        tmp_path / "out", flashinfer=published, cuda_version="13.0", platform="linux_x86_64",
        modules=[wheel.Module(name="trtllm_comm", so=so, targets=("sm_90a", "sm_120f",
                                                                   "sm_121a"),
                              info={}, sources_digest="sha256:" + "0" * 64)],
        stack="sglang-0.5.23", toolkit_version="0", toolchain={},
        lookup=wheel.JIT_CACHE_PROVIDERS)
    target = tmp_path / "site"
    _install(built, target)
    out = subprocess.run(
        [sys.executable, "-c", "import json; from importlib.metadata import entry_points; "
         "(e,) = entry_points(group='flashinfer.jit_cache.providers'); "
         "print(json.dumps([e.name, e.load()()]))"],
        check=True, capture_output=True, text=True, env={"PYTHONPATH": str(target)},
        cwd=tmp_path).stdout
    name, manifest = json.loads(out)
    assert name == "sm120fork"
    assert manifest == {
        "schema_version": 1, "provider_id": "sm120fork",
        "distribution": "sm120fork-flashinfer-aot", "version": "0.7.2+cu130",
        "jit_cache_dir": str(target / "sm120fork_flashinfer_aot" / "jit_cache"),
        "cuda_architectures": ["sm120f", "sm121a", "sm90a"], "modules": ["trtllm_comm"]}
    assert (Path(manifest["jit_cache_dir"]) / "trtllm_comm" / "trtllm_comm.so").is_file()


def test_a_manifest_that_is_not_one_is_named_with_the_wheel(tmp_path: Path) -> None:
    """Read once, typed (AotManifest): a manifest without a module's sha256 is a BuildError
    naming the wheel's member, not a KeyError where a reader indexed it."""
    built = _write(tmp_path)
    bad = tmp_path / "bad.whl"
    member = f"{wheel.PACKAGE}/{wheel.MANIFEST}"
    with zipfile.ZipFile(built) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == member:
                manifest = json.loads(data)
                del manifest["modules"]["trtllm_comm"]["sha256"]
                data = json.dumps(manifest).encode()
            dst.writestr(item, data)
    with pytest.raises(BuildError, match="not an AOT wheel's manifest") as err:
        wheel.read_wheel(bad)
    assert err.value.where == f"{bad}:{member}"


def test_the_lookup_probes_answer_that_is_not_one_is_named() -> None:
    from sm120fork.aot import check
    from sm120fork.errors import VerifyError

    answer: dict[str, object] = {
        "flashinfer": "/fi", "flashinfer_version": "0.7.2", "lookup": None, "providers": [],
        "folders": [], "modules": {"trtllm_comm": {"copies": []}}}
    with pytest.raises(VerifyError, match="the lookup probe's answer is not one"):
        check.Found.from_json(answer)
    answer["modules"] = {"trtllm_comm": {"loads_from": None, "copies": []}}
    found = check.Found.from_json(answer)
    assert found.modules["trtllm_comm"] == check.ModuleLookup()
    assert found.printed is answer
