"""The offline GPU kit: what it carries, and that a box with no index installs and runs it."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

from helpers_manifest import entry, write_manifest
from sm120fork.errors import ConfigError, NoGpuError
from sm120fork.kit import boot
from sm120fork.kit.build import (
    KitOptions,
    Resolved,
    Target,
    make,
    needed,
    parse_size,
    resolution,
)
from sm120fork.resolved import ResolvedStack
from sm120fork.workspace import Workspace

from helpers_ws import checkout_copy

ROOT = Path(__file__).resolve().parents[2]
HARNESS_MODULES = ("sm120fork.gpu.cli", "sm120fork.gpu.ab.run", "sm120fork.gpu.bench.run",
                   "sm120fork.gpu.layer.run", "sm120fork.gpu.upstream_tests",
                   "sm120fork.gpu.core.variants", "sm120fork.gpu.core.records",
                   "sm120fork.doctor.cli", "sm120fork.record")


@functools.cache
def _noxfile() -> ModuleType:
    """Loaded once, leaving nox's registry as it was (another test file loads it too)."""
    import nox.registry

    before = nox.registry.get()
    spec = importlib.util.spec_from_file_location("noxfile_kit", ROOT / "noxfile.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    nox.registry.reset()
    try:
        spec.loader.exec_module(module)
    finally:
        nox.registry.reset()
        nox.registry._REGISTRY.update(before)
    return module


class _Recorder:
    def __init__(self) -> None:
        self.posargs: list[str] = []
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.virtualenv = None  # no location: the noxfile's install() always installs

    def log(self, *_: object) -> None:
        pass

    def install(self, *args: str) -> None:
        self.calls.append(("install", args))

    def run(self, *args: str, **_: object) -> None:
        self.calls.append(("run", args))


@pytest.mark.parametrize("name", ["gpu_test", "bench", "sglang_layer"])
def test_gpu_sessions_see_the_torch_of_the_python_running_nox(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    nf = _noxfile()
    session = getattr(nf, name)
    assert session.python is None  # the Python that runs nox (python3 -m nox there)
    assert session.venv_params == ["--system-site-packages"]
    recorder = _Recorder()
    monkeypatch.setattr(nf, "ready", lambda _, *command: recorder.calls.append(
        ("ready", command)))
    session.func(recorder)
    # first the arguments and this machine are checked (tests/cli/test_preflight.py)
    assert recorder.calls[0] == ("ready", ("gpu", name.replace("gpu_", "").replace("_", "-")))
    # before the toolkit is installed: the venv sees that Python's packages (its torch)
    assert recorder.calls[1] == ("run", ("python", "src/sm120fork/kit/boot.py", "see-host",
                                         sys.executable))
    assert recorder.calls[2][0] == "install"


def test_see_host_makes_a_venv_see_the_packages_of_another_python(tmp_path: Path) -> None:
    """The box's Python may itself be a venv (its torch is then no "system" package)."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    probe = [python, "-c", "import packaging, sm120fork; print(packaging.__file__)"]
    assert subprocess.run(probe, capture_output=True, check=False).returncode != 0
    subprocess.run([python, str(ROOT / "src/sm120fork/kit/boot.py"), "see-host",
                    sys.executable], check=True, capture_output=True)
    done = subprocess.run(probe, capture_output=True, text=True, check=True)
    assert done.stdout.strip().startswith(str(Path(sys.prefix)))


def _stack(root: Path) -> ResolvedStack:
    return ResolvedStack.named(Workspace.find(root), "sglang-0.5.23")


def _report(*items: tuple[str, str, list[str]]) -> dict[str, Resolved]:
    return resolution({"install": [{"metadata": {"name": n, "version": v,
                                                 "requires_dist": deps}}
                                   for n, v, deps in items]}, "resolution.json")


def test_a_pip_report_that_is_not_one_is_refused_naming_the_file_and_key() -> None:
    with pytest.raises(ConfigError) as err:
        resolution({"install": [{"metadata": {"name": "a", "version": "1"}},
                                {"metadata": {"name": "b"}}]}, "resolution.json")
    assert err.value.where == "resolution.json: install[1].metadata"
    with pytest.raises(ConfigError) as err:
        resolution({"install": [{"metadata": {"name": "a", "version": "1",
                                              "requires_dist": "b"}}]}, "r.json")
    assert err.value.where == "r.json: install[0].metadata.requires_dist"


def test_what_only_torch_needs_stays_behind_with_torch() -> None:
    report = _report(
        ("flashinfer-python", "1", ["torch", "numpy", "cuda-tile"]),
        ("torch", "2", ["sympy", "nvidia-nccl-cu13; platform_system == 'Linux'", "numpy"]),
        ("sympy", "1", ["mpmath"]), ("mpmath", "1", []), ("nvidia-nccl-cu13", "2", []),
        ("numpy", "2", []), ("cuda-tile", "1.7", ["typing-extensions; python_version<'3.0'"]),
        ("typing-extensions", "4", []))
    target = Target(python="3.12", platforms=("manylinux_2_28_x86_64",))
    roots = [Requirement("flashinfer-python")]
    assert needed(report, roots, target, {"torch": None}) == [
        ("cuda-tile", "1.7"), ("flashinfer-python", "1"), ("numpy", "2")]
    # the box has numpy: any version (a name), or this one (name==version)
    assert ("numpy", "2") not in needed(report, roots, target, {"torch": None, "numpy": None})
    assert ("numpy", "2") not in needed(report, roots, target, {"torch": None, "numpy": "2"})
    assert ("numpy", "2") in needed(report, roots, target, {"torch": None, "numpy": "1.26"})


def test_sizes() -> None:
    assert parse_size("64MiB") == 64 * 1024 * 1024
    assert parse_size("500k") == 500 * 1024
    with pytest.raises(ConfigError, match="bad size"):
        parse_size("lots")


def test_a_stack_without_a_build_names_the_command_that_makes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = checkout_copy(tmp_path, sdists=False)
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")
    with pytest.raises(ConfigError) as err:
        make(KitOptions(python="3.12", out=tmp_path / "kit"), _stack(root))
    assert err.value.fix == "nox -s build -- --stack sglang-0.5.23"
    assert not (tmp_path / "kit").exists()


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}/__init__.py", f"__version__ = '{version}'\n")
        zf.writestr(f"{dist}.dist-info/METADATA", meta)
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return path


@pytest.mark.slow
@pytest.mark.network
def test_a_kit_installs_with_no_index_and_runs_its_harness(tmp_path: Path) -> None:
    """A kit of a stack (a FlashInfer stand-in that requires torch and CuTe-DSL, which stay
    behind, and packaging), in parts: the entry of the last part joins them and gets as far
    as the GPU check (this machine has none); a fresh venv installs from the joined folder
    alone and imports every harness."""
    root = checkout_copy(tmp_path, sdists=False)
    folder = root / "wheels" / "sglang-0.5.23"
    folder.mkdir(parents=True)
    fi = _wheel(folder, "flashinfer-python", "0.7.2",
                ["torch", "packaging>=24", "nvidia-cutlass-dsl>=4"])
    write_manifest(folder, "sglang-0.5.23", entry("flashinfer", wheel=fi.name,
                                                  sha256="ab" * 32, used_as_published=True))
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    kit = make(KitOptions(python=python, out=tmp_path / "kit",
                          harnesses=("gpu_test",), nox=False), _stack(root)).path
    files = sorted(p.name for p in (kit / "wheels").glob("*.whl"))
    assert any(f.startswith("sm120fork-") for f in files)
    assert any(f.startswith("packaging-") for f in files)
    assert not any(f.startswith(("torch-", "nvidia_cutlass")) for f in files)
    data = json.loads((kit / "kit.json").read_text())
    assert data["patched"] == {"flashinfer": f"stack/{fi.name}"}
    assert data["upstream"] == {}  # as published: no A/B
    assert json.loads((kit / "stack" / "tested.json").read_text())["patches"] == []
    # The same kit in parts smaller than its toolkit wheel, as a size-limited transfer path
    # takes it: the entry of any part joins them, byte for byte, before anything else.
    from sm120fork.kit.build import write_parts

    (tmp_path / "box").mkdir()
    parts = write_parts(kit, tmp_path / "box" / "kit", 256 * 1024)
    assert len(parts) > 2
    assert any(".piece-1-of-" in p.name for folder, _ in parts for p in folder.rglob("*"))
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    # The entry, with this Python as the box's (CPU torch: no GPU), and the kit's own venv.
    done = subprocess.run(["sh", parts[-1][0] / "run", "gpu_test", "--quick", "--out",
                           tmp_path / "r"], capture_output=True, text=True, check=False,
                          cwd=tmp_path, env={**env, "PYTHON": sys.executable,
                                             "SM120FORK_KIT_HOME": str(tmp_path / "home")})
    assert done.returncode == NoGpuError.exit_code, done.stderr
    assert "error: " in done.stderr.splitlines()[-1]
    joined = tmp_path / "box" / "kit"
    assert {p.relative_to(joined).as_posix(): p.read_bytes() for p in joined.rglob("*")
            if p.is_file() and p.name != boot.JOINED_FILE} == {
        p.relative_to(kit).as_posix(): p.read_bytes() for p in kit.rglob("*") if p.is_file()}
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", joined / "wheels", *data["requirements"]["gpu_test"]],
                   check=True, env=env)
    subprocess.run([venv / "bin" / "python", "-c", "; ".join(
        f"import {m}" for m in HARNESS_MODULES)], check=True)


def test_the_entry_refuses_another_python(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / boot.KIT_FILE).write_text(json.dumps({"format": boot.KIT_FORMAT, "python": "3.99",
                                                 "requirements": {}, "wheels": []}))
    data = boot.load(kit)
    with pytest.raises(boot.KitError, match=r"this kit is for Python 3\.99"):
        boot.prepare(kit, data, "gpu_test", tmp_path / "home")


def test_the_entry_names_a_harness_the_kit_does_not_carry(tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    kit.mkdir()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (kit / boot.KIT_FILE).write_text(json.dumps({
        "format": boot.KIT_FORMAT, "python": python, "wheels": [],
        "requirements": {"gpu_test": ["sm120fork"]}}))
    with pytest.raises(boot.KitError, match="--harness sglang_layer") as err:
        boot.prepare(kit, boot.load(kit), "sglang_layer", tmp_path / "home")
    assert err.value.code == boot.EXIT_USAGE


@pytest.mark.parametrize("torch_here", [False, True])
def test_an_install_that_fails_for_want_of_torch_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_here: bool) -> None:
    """The kit carries no torch (the box's CUDA build serves): a Python without it is the
    cause, not a package to add with --include (which said so on a CPU box's doctor)."""
    import importlib.util

    kit = tmp_path / "kit"
    (kit / "wheels").mkdir(parents=True)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (kit / boot.KIT_FILE).write_text(json.dumps({
        "format": boot.KIT_FORMAT, "python": python, "wheels": [],
        "requirements": {"doctor": ["torch-needing-package-the-kit-lacks"]}}))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        find_spec(name, *a) if name != "torch" or torch_here else None))
    with pytest.raises(boot.KitError) as err:
        boot.prepare(kit, boot.load(kit), "doctor", tmp_path / "home")
    said = str(err.value)
    assert ("has no torch, which the kit leaves to the box" in said) is not torch_here
    assert ("that package's name in --include" in said) is torch_here


def test_what_the_box_has_is_a_freeze_file_or_names(tmp_path: Path) -> None:
    from sm120fork.kit.build import _parse_box_has

    freeze = tmp_path / "box.txt"
    freeze.write_text("torch==2.11.0\nNumPy==2.5.2\n# a comment\n-e git+x#egg=y\n")
    long_list = ",".join(f"name-{i}" for i in range(100))  # longer than a file name may be
    found = _parse_box_has([str(freeze), "pillow,hf_xet", long_list])
    assert found["numpy"] == "2.5.2"
    assert found["torch"] == "2.11.0"
    assert found["pillow"] is None
    assert found["hf-xet"] is None
    assert "name-99" in found
    with pytest.raises(ConfigError, match="no such file"):
        _parse_box_has([str(tmp_path / "missing.txt")])


def test_prebuilt_modules_travel_per_variant_with_their_sources_marker(tmp_path: Path) -> None:
    from sm120fork.kit.build import _copy_prebuilt

    for variant in ("patched", "unpatched"):
        module = tmp_path / "pb" / variant / "trtllm_comm"
        module.mkdir(parents=True)
        (module / "trtllm_comm.so").write_bytes(b"\x7fELF")
        (module / "trtllm_comm.so.sources").write_text("digest\n")
    assert _copy_prebuilt(tmp_path / "pb", tmp_path / "kit" / "prebuilt") == {
        "patched": "prebuilt/patched", "unpatched": "prebuilt/unpatched"}
    assert (tmp_path / "kit/prebuilt/patched/trtllm_comm/trtllm_comm.so.sources").is_file()
    with pytest.raises(ConfigError, match="holds no"):
        _copy_prebuilt(tmp_path / "kit" / "prebuilt" / "patched", tmp_path / "other")


class _Answering(_Recorder):
    """A session whose ``gpu-requirements`` run prints what the stack's wheels need."""

    def run(self, *args: str, **kw: object) -> str | None:  # type: ignore[override]
        self.calls.append(("run", args))
        return "apache-tvm-ffi<0.2,>=0.1.6\ncuda-tile\n" if "gpu-requirements" in args else None


@pytest.mark.parametrize(("name", "harness"), [("gpu_test", "gpu_test"), ("bench", "bench"),
                                               ("sglang_layer", "sglang_layer"),
                                               ("tune", "tune")])
def test_gpu_sessions_install_what_the_stacks_flashinfer_needs(
        name: str, harness: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200, `nox -s gpu_test -- --stack S --quick` failed in every case with 'No
    module named tvm_ffi': the variants' FlashInfer is installed without its dependencies,
    and the session installed only the toolkit."""
    session = _Answering()
    session.posargs = ["--stack", "sglang-0.5.10", "--quick"]
    nf = _noxfile()
    monkeypatch.setattr(nf, "ready", lambda *_: None)  # no GPU here
    getattr(nf, name).func(session)
    asked = next(args for kind, args in session.calls if "gpu-requirements" in args)
    assert asked[asked.index("--harness") + 1] == harness
    assert list(asked[asked.index("--") + 1:]) == session.posargs
    assert ("install", ("-q", "apache-tvm-ffi<0.2,>=0.1.6", "cuda-tile")) in session.calls


def test_the_requirements_of_a_harness_leave_torch_and_unused_kernels_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sm120fork.kit.build import stack_requirements

    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")

    root = checkout_copy(tmp_path, sdists=False)
    folder = root / "wheels" / "sglang-0.5.23"
    folder.mkdir(parents=True)
    fi = _wheel(folder, "flashinfer-python", "0.7.2",
                ["torch", "apache-tvm-ffi<0.2", "nvidia-cutlass-dsl>=4", "cuda-tile"])
    write_manifest(folder, "sglang-0.5.23", entry("flashinfer", wheel=fi.name,
                                                  sha256="ab" * 32, used_as_published=True))
    assert stack_requirements(_stack(root), "gpu_test") == [
        "apache-tvm-ffi<0.2", "cuda-tile"]
    with pytest.raises(ConfigError) as err:
        stack_requirements(_stack(root), "sglang_layer")
    assert err.value.fix == "nox -s build -- --stack sglang-0.5.23"


def _sglang_build(root: Path, python: str) -> tuple[Path, Path]:
    """A built sglang-0.5.23 as the build leaves it: FlashInfer as published, a patched
    SGLang of upstream's wheel (in the build's wheel cache), and the plugin wheel."""
    from sm120fork.util.files import sha256_file

    folder = root / "wheels" / "sglang-0.5.23"
    (folder / "plugin").mkdir(parents=True)
    fi = _wheel(folder, "flashinfer-python", "0.7.2", ["torch", "packaging>=24"])
    tag = f"cp{python.replace('.', '')}-cp{python.replace('.', '')}-manylinux_2_34_x86_64"
    cache = root / ".forks" / "cache" / "wheels"
    cache.mkdir(parents=True)
    stock = _wheel(cache, "sglang", "0.5.23", ["numpy"]).rename(
        cache / f"sglang-0.5.23-{tag}.whl")
    with zipfile.ZipFile(stock, "a") as zf:  # bigger than a part: it travels in pieces
        zf.writestr("sglang/blob.bin", os.urandom(200 * 1024), zipfile.ZIP_STORED)
    patched = _wheel(folder, "sglang", "0.5.23+sm120.1", ["numpy"]).rename(
        folder / f"sglang-0.5.23+sm120.1-{tag}.whl")
    plugin = _wheel(folder / "plugin", "sm120fork-sglang-plugin", "0.5.23+sm120.1", [])
    (folder / "plugin" / "plugin.json").write_text(json.dumps({"wheel": plugin.name}))
    write_manifest(
        folder, "sglang-0.5.23",
        entry("flashinfer", wheel=fi.name, sha256=sha256_file(fi), used_as_published=True),
        entry("sglang", wheel=patched.name, sha256=sha256_file(patched),
              patches=[{"name": "0001-G1.patch", "sha256": "0" * 64, "subject": "G1"}],
              source={"kind": "wheel", "filename": stock.name, "digest": sha256_file(stock)}))
    return stock, plugin


def test_the_doctor_of_a_stack_with_sglang_carries_sglangs_imports(tmp_path: Path) -> None:
    """On the H200 the kit's doctor ran SGLang's --tp decisions without SGLang's imports
    ("No module named 'orjson'"): a stack with SGLang gives the doctor what SGLang imports;
    a FlashInfer-only stack's doctor stays FlashInfer's."""
    from sm120fork.kit.build import SGLANG_LAYER_IMPORTS, harness_requirements

    fi = _wheel(tmp_path, "flashinfer-python", "0.7.2", ["torch", "packaging>=24"])
    sgl = _wheel(tmp_path, "sglang", "0.5.23", ["orjson==3.11.0", "numpy"])
    names = {str(r.name) for r in harness_requirements("doctor", {"flashinfer": fi,
                                                                  "sglang": sgl})}
    assert set(SGLANG_LAYER_IMPORTS) <= names
    assert "orjson==3.11.0" in {str(r) for r in harness_requirements(
        "doctor", {"flashinfer": fi, "sglang": sgl})}
    assert {str(r) for r in harness_requirements("doctor", {"flashinfer": fi})} == \
        {"packaging>=24"}


def test_the_layer_kit_carries_the_plugin_route_and_travels_in_parts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a patched SGLang, the sglang_layer kit also carries stock SGLang of the pin and
    the plugin wheel; with --part-size it is written as parts that join to that kit."""
    from sm120fork.kit import build
    from sm120fork.util.files import sha256_file

    root = checkout_copy(tmp_path, sdists=False)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stock, plugin = _sglang_build(root, python)
    # pip's resolution and downloads are the slow test's; here the kit's own plumbing
    monkeypatch.setattr(build, "resolve", lambda *_: {"install": []})
    monkeypatch.setattr(build, "download", lambda *_: None)
    monkeypatch.setattr(build, "_toolkit_wheel",
                        lambda _root, dest: _wheel(dest, "sm120fork", "0.1.0", []))
    out = tmp_path / "box" / "kit"
    kit = make(KitOptions(python=python, out=out,
                          harnesses=("sglang_layer",), nox=False, part_size=128 * 1024,
                          platforms=(*build.manylinux(), "linux_x86_64")), _stack(root))
    assert not out.exists()
    assert [p.name for p, _ in kit.parts] == [f"kit.{i}" for i in range(1, len(kit.parts) + 1)]
    assert all(size <= 128 * 1024 for _, size in kit.parts)
    last = kit.parts[-1][0]
    joined = boot.join(last, boot.read_parts(last))
    assert joined == out
    data = json.loads((joined / "kit.json").read_text())
    assert data["plugin_route"] == {"plugin": f"stack/plugin/{plugin.name}",
                                    "sglang": f"upstream/{stock.name}"}
    assert (joined / "upstream" / stock.name).read_bytes() == stock.read_bytes()
    assert (joined / "stack" / "plugin" / plugin.name).read_bytes() == plugin.read_bytes()
    assert (joined / "stack" / "plugin" / "plugin.json").is_file()
    assert sorted(p.relative_to(joined).as_posix() for p in joined.rglob("*")
                  if p.is_file()) == sorted([*kit.files, boot.JOINED_FILE])
    # `sh run sglang_layer --plugin-route`: stock SGLang unpacked, the plugin and the
    # stack's FlashInfer in a venv of the route's own, the record's notes naming the wheels
    home = tmp_path / "home"
    venv_python = boot.prepare(joined, data, "sglang_layer", home, plugin_route=True)
    assert venv_python.parent.parent.name == "venv-plugin-route"
    seen = subprocess.run([venv_python, "-c", "import importlib.metadata as m; print(m.version("
                           "'sm120fork-sglang-plugin'), m.version('flashinfer-python'))"],
                          capture_output=True, text=True, check=True)
    assert seen.stdout.split() == ["0.5.23+sm120.1", "0.7.2"]
    cmd, _ = boot.harness_command(joined, data, "sglang_layer",
                                  ["--plugin-route", "--world-size", "2"], home)
    tree = home / "plugin-route" / "sglang"
    assert cmd[:5] == ["sm120fork.gpu", "sglang-layer", "--sglang-path", str(tree),
                       "--load-plugins"]
    assert (tree / "sglang" / "blob.bin").is_file()
    notes = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--note"]
    assert notes == [f"plugin route: stock {stock.name} sha256 {sha256_file(stock)}",
                     f"plugin route: the plugin {plugin.name} sha256 {sha256_file(plugin)}"]
    assert "--plugin-route" not in cmd
    assert cmd[-2:] == ["--world-size", "2"]
    # the harness reads the layout from forks/ otherwise: the box has no checkout
    assert data["sglang_layout"] == "layer_boundary"
    assert cmd[cmd.index("--layout") + 1] == "layer_boundary"
    patched_cmd, _ = boot.harness_command(joined, data, "sglang_layer", [], home)
    assert patched_cmd[:4] == ["sm120fork.gpu", "sglang-layer", "--stack-dir",
                               str(joined / "stack")]
    assert patched_cmd[patched_cmd.index("--layout") + 1] == "layer_boundary"
    # without the upstream wheel the build fetched, the kit names the command that does
    stock.unlink()
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")
    with pytest.raises(ConfigError, match="plugin route's SGLang") as err:
        make(KitOptions(python=python, out=out,
                        harnesses=("sglang_layer",), nox=False), _stack(root))
    assert err.value.fix == "nox -s build -- --stack sglang-0.5.23"
    # the other harnesses do not need it
    make(KitOptions(python=python, out=out, harnesses=("gpu_test",),
                    nox=False), _stack(root))
    assert not list((out / "upstream").glob("sglang-*"))
    assert not (out / "stack" / "plugin").exists()


def test_the_boxs_torch_stays_behind_whatever_version_its_freeze_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `pip list --format=freeze` of a CUDA box names torch with a local label
    (torch==2.11.0+cu130), which no index version equals: the kit carried the index's torch
    and its CUDA libraries (2.4 GB for sglang-0.5.23) instead of leaving the box's."""
    from sm120fork.kit import build

    root = checkout_copy(tmp_path, sdists=False)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    _sglang_build(root, python)
    report = _report(("flashinfer-python", "0.7.2", ["torch", "packaging>=24"]),
                     ("torch", "2.11.0", ["nvidia-cublas"]), ("nvidia-cublas", "13", []),
                     ("packaging", "26.0", []))
    monkeypatch.setattr(build, "resolve", lambda *_: report)
    downloaded: list[tuple[str, str]] = []
    monkeypatch.setattr(build, "download", lambda pins, *_: downloaded.extend(pins))
    monkeypatch.setattr(build, "_toolkit_wheel",
                        lambda _root, dest: _wheel(dest, "sm120fork", "0.1.0", []))
    freeze = tmp_path / "box.txt"
    freeze.write_text("torch==2.11.0+cu130\npackaging==24.0\n")
    make(KitOptions(python=python, out=tmp_path / "kit",
                    harnesses=("gpu_test",), nox=False, box_has=(str(freeze),)), _stack(root))
    assert downloaded == [("packaging", "26.0")]  # the box has 24.0: the kit carries 26.0


def test_the_tune_verb_runs_tune_on_the_kits_flashinfer_and_records_for_import(
        tmp_path: Path) -> None:
    """``sh DIR/run tune``: the owner's one command on a box with no checkout: tune
    benches the kit's FlashInfer (not wheels/<stack>/, which the box lacks), names the
    stack for the record and writes it where ``record import`` takes it from."""
    kit = tmp_path / "kit"
    data: boot.KitJson = {"stack": "sglang-0.5.23",
                               "patched": {"flashinfer": "stack/fi.whl"},
                               "prebuilt": {"patched": "prebuilt/patched"}}
    cmd, env = boot.harness_command(kit, data, "tune", ["--world-sizes", "2", "--yes"],
                                    tmp_path / "home")
    assert cmd[:4] == ["sm120fork", "tune", "--stack", "sglang-0.5.23"]
    assert cmd[cmd.index("--wheel-dir") + 1] == f"patched={kit / 'stack' / 'fi.whl'}"
    assert cmd[cmd.index("--prebuilt") + 1] == f"patched={kit / 'prebuilt' / 'patched'}"
    assert cmd[cmd.index("--reports") + 1] == "kit-results"
    assert "--out" not in cmd  # tune has no --out
    assert cmd[-3:] == ["--world-sizes", "2", "--yes"]
    assert env["SM120FORK_COMMAND"] == "sh '<kit sglang-0.5.23>/run' tune --world-sizes 2 --yes"
    assert "tune" in boot.VERBS


def test_the_kits_doctor_examines_the_kits_venv_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: the doctor's own default is python3 on PATH; the kit's doctor looks at the
    kit's venv, where the stack's wheels are beside it (``doctor-site``)."""
    from sm120fork.doctor import cli

    kit, home = tmp_path / "kit", tmp_path / "home"
    data: boot.KitJson = {"stack": "s", "patched": {"flashinfer": "stack/fi.whl"}}
    (home / "doctor-site").mkdir(parents=True)
    (home / "doctor-site" / ".installed").write_text(str(kit / "stack" / "fi.whl"))
    cmd, env = boot.harness_command(kit, data, "doctor", [], home)
    assert cmd == ["sm120fork.doctor"]
    monkeypatch.setenv("PATH", "")  # python3 on PATH is not asked
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cli.main([])
    assert capsys.readouterr().out.splitlines()[0] == (
        f"doctor of {sys.executable} (the kit's venv, beside the stack's wheels)")


@pytest.mark.parametrize("parts", [False, True])
def test_the_kits_closing_command_is_one_line_at_any_width(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parts: bool) -> None:
    """The command to run on the box is pasted from the log: never wrapped (it was, at
    nox's 80 columns, after 'run gpu_test')."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from sm120fork.cli import kit as cli_kit
    from sm120fork.cli.main import make_parser
    from sm120fork.kit import build as kit_build

    out = tmp_path / "a-rather-long-folder-name" / ".kit" / "s510"
    made = kit_build.Kit(path=out, files={"wheels/a.whl": 1},
               parts=((out.with_name("s510.1"), 1),) if parts else ())
    monkeypatch.setattr(kit_build, "make", lambda *_a, **_k: made)
    ws = SimpleNamespace(root=tmp_path, stack=lambda _name: SimpleNamespace(name="s"),
                         stack_wheels=lambda name: tmp_path / name)
    args = make_parser(["gpu-kit"]).parse_args(
        ["gpu-kit", "--python", "3.12", "--out", str(out)])
    text = io.StringIO()
    assert cli_kit.run(args, ws, Console(file=text, width=40)) == 0  # type: ignore[arg-type]
    last = text.getvalue().splitlines()[-1]
    assert last.endswith("/run gpu_test --quick --out results"), text.getvalue()
