"""The real default stack from the package index, end to end (network, ~1-2 min)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from sm120fork.cli.main import main
from sm120fork.verify.proof.patches import VERIFY_STACK_ENV

from conftest import git
from helpers_flashinfer import cubin_stand_in, install_flashinfer, put_upstream_file
from helpers_ws import checkout_copy

#: The stack verify-sm120 runs a claim's test for (a copy of the default stack under
#: another name builds its own series), else the default stack.
STACK = os.environ.get(VERIFY_STACK_ENV) or "sglang-0.5.10"
pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.runs_stack(STACK)]
REPO = Path(__file__).resolve().parents[2]
STACK_WHEELS = Path("wheels", STACK)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = checkout_copy(tmp_path_factory.mktemp("e2e"))
    assert main(["--root", str(root), "build", "--stack", STACK]) == 0
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
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
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


def test_the_index_of_the_real_build_resolves_its_landing_line_to_our_wheels(
        built: Path, tmp_path: Path) -> None:
    """The default stack's line on the landing page of `index` (its file:// URL), with
    the user's package index as the other source: pip's report takes both our wheels from
    the site (dependencies left out: torch alone is GBs)."""
    import html

    assert main(["--root", str(built), "index", "--out", str(tmp_path / "site")]) == 0
    landing = (tmp_path / "site" / "index.html").read_text()
    section = landing.split(f'<h2 id="{STACK}">')[1].split("<h2")[0]
    line = html.unescape(re.findall(r"<td>patched wheels</td><td><code>([^<]+)</code>",
                                    section)[0])
    assert line.startswith("pip install --extra-index-url ")
    report = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
         "--quiet", "--report", "-", *line.split()[2:]],
        check=True, capture_output=True, text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}).stdout
    chosen = {i["metadata"]["name"]: (i["metadata"]["version"], i["download_info"]["url"])
              for i in json.loads(report)["install"]}
    site = (tmp_path / "site").resolve().as_uri()
    assert {n: v for n, (v, _) in chosen.items()} == {
        "flashinfer-python": "0.6.7.post3+sm120.1", "sglang": "0.5.10.post1+sm120.1"}
    assert all(url.startswith(f"{site}/files/") for _, url in chosen.values())


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
    toml = built / "forks" / f"{STACK}.toml"
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
    work = built / ".forks" / "trees" / STACK / "flashinfer"
    assert git(work, "rev-parse", "upstream") == sha
    # Same content as the sdist-based tree: identical patched tree hash.
    assert main(["--root", str(built), "build", "--force"]) == 0
    sdist_manifest = json.loads((built / STACK_WHEELS / "manifest.json").read_text())
    assert sdist_manifest["wheels"][0]["tree"] == fi["tree"]


def _install_flashinfer(built: Path, site: Path) -> None:
    """Our FlashInfer wheel of the stack, installed into the folder ``site``."""
    install_flashinfer(built, STACK_WHEELS.name, site)


def _put_upstream_file(built: Path, site: Path, path: str) -> None:
    """Replace the installed ``path`` (``flashinfer/...``) by unpatched upstream's."""
    put_upstream_file(built, STACK_WHEELS.name, site, path)


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
    cubin_stand_in(site, "0.6.7.post3")


def test_flashinfer_imports_beside_the_pinned_flashinfer_cubin(built: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")  # flashinfer.compilation_context imports it
    site = tmp_path / "site"
    _install_flashinfer(built, site)
    _cubin_stand_in(site)
    ours = subprocess.run([sys.executable, "-c", _ENV_PROBE, str(site)], capture_output=True,
                          text=True, check=False)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert "flashinfer_cubin" in ours.stdout
    # The same check with upstream's env.py refuses our local-label version: patch 0001.
    _put_upstream_file(built, site, "flashinfer/jit/env.py")
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
    _install_flashinfer(built, site)
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
    _put_upstream_file(built, site, "flashinfer/jit/core.py")
    theirs, _ = _probe_prebuilt(site, tmp_path)
    assert theirs["aot"] is True
    assert Path(str(theirs["library"])) == stock


# Modules of a stock flashinfer-jit-cache the stand-in holds, with the JitSpec makers our
# FlashInfer asks (names as FlashInfer gives them).  trtllm_comm is built from sources the
# series changes; the others are not.
_STOCK_MODULES = {
    "trtllm_comm": "flashinfer.jit.comm:gen_trtllm_comm_module",
    "norm": "flashinfer.jit.norm:gen_norm_module",
    "sampling": "flashinfer.jit.sampling:gen_sampling_module",
    "page": "flashinfer.jit.page:gen_page_module",
    "rope": "flashinfer.jit.rope:gen_rope_module",
}

_MODULES_PROBE = _FLASHINFER_SITE + r"""
out = {}
for maker in sys.argv[2:]:
    where, _, function = maker.partition(":")
    spec = getattr(importlib.import_module(where), function)()
    # Asked several times, as FlashInfer does (build_jit_specs, build_and_load, ...).
    aot = [spec.is_aot, spec.is_aot, spec.is_aot]
    out[spec.name] = {"aot": aot, "library": str(spec.get_library_path())}
print(json.dumps(out))
"""


def _stock_cache(site: Path, names: list[str], *, package: str = "flashinfer_jit_cache"
                 ) -> Path:
    """A stock flashinfer-jit-cache 0.6.7.post3: fake modules in its layout, no markers."""
    pkg = site / package
    for name in names:
        (pkg / "jit_cache" / name).mkdir(parents=True)
        (pkg / "jit_cache" / name / f"{name}.so").write_bytes(b"\x7fELF stock " + name.encode())
    (pkg / "__init__.py").write_text(
        '__version__ = "0.6.7.post3+cu130"\n\nfrom pathlib import Path\n\n'
        'def get_jit_cache_dir():\n    return str(Path(__file__).parent / "jit_cache")\n')
    return pkg / "jit_cache"


def test_a_stock_jit_cache_serves_every_module_the_series_does_not_change(
        built: Path, tmp_path: Path) -> None:
    """Patch 0002 narrowed: beside a stock flashinfer-jit-cache every module whose sources
    the series leaves alone loads from it; its trtllm_comm (built from sources the series
    changes) does not; each decision is logged once."""
    pytest.importorskip("torch")  # flashinfer.compilation_context imports it
    from sm120fork.patch.series import load_series

    site = tmp_path / "site"
    _install_flashinfer(built, site)
    # The build recorded the files the series changes, from the series itself.
    record = (site / "flashinfer" / "jit" / "series_sources.py").read_text()
    recorded = set(re.findall(r'^    "([^"]+)",$', record, re.M))
    series = load_series(built / "patches" / STACK / "flashinfer")
    assert recorded == {f for p in series.patches for f in p.files}
    assert "csrc/trtllm_allreduce.cu" in recorded

    cache = _stock_cache(site, list(_STOCK_MODULES))
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", _MODULES_PROBE, str(site),
                           *_STOCK_MODULES.values()],
                          capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == set(_STOCK_MODULES)
    for name, result in found.items():
        stock = cache / name / f"{name}.so"
        lines = [line for line in done.stderr.splitlines() if f"prebuilt {name} " in line]
        assert len(lines) == 1, (name, done.stderr[-3000:])
        if name == "trtllm_comm":
            assert result["aot"] == [False] * 3
            assert Path(result["library"]) != stock
            assert "not loading prebuilt trtllm_comm" in lines[0]
            assert "csrc/trtllm_allreduce.cu" in lines[0]
            assert "JIT-compiling it instead" in lines[0]
        else:
            assert result["aot"] == [True] * 3, (name, done.stderr[-3000:])
            assert Path(result["library"]) == stock
            assert f"loading prebuilt {name} from {stock}" in lines[0]
            assert "none of its sources is changed by this build's patches" in lines[0]


def _stock_jit_cache_wheel(out: Path, names: list[str]) -> Path:
    """A stand-in of upstream's flashinfer-jit-cache wheel (fake modules, its layout)."""
    src = out / "src"
    _stock_cache(src, names)
    version = "0.6.7.post3+cu130"
    dist_info = f"flashinfer_jit_cache-{version}.dist-info"
    members = {p.relative_to(src).as_posix(): p.read_bytes()
               for p in sorted(src.rglob("*")) if p.is_file()}
    members[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {version}\n\n").encode()
    members[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
        b"Tag: py3-none-linux_x86_64\n")
    members[f"{dist_info}/RECORD"] = "".join(f"{n},,\n" for n in [*members, f"{dist_info}/RECORD"]
                                             ).encode()
    wheel = out / f"flashinfer_jit_cache-{version}-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return wheel


def _our_aot_wheel(built: Path, site: Path, tmp_path: Path, target: str) -> Path:
    """Our AOT wheel with a stand-in trtllm_comm module for ``target``, recorded as built
    from the sources of the FlashInfer installed in ``site``."""
    from sm120fork.aot import wheel as aot_wheel
    from sm120fork.aot.pipeline import flashinfer_build
    from sm120fork.declare import load_stack

    data = site / "flashinfer" / "data"
    so = tmp_path / "trtllm_comm.so"
    so.write_bytes(b"\x7fELF ours")
    flashinfer = flashinfer_build(built / STACK_WHEELS,
                                  load_stack(built / "forks" / f"{STACK}.toml"))
    return aot_wheel.write_wheel(
        tmp_path / "ours", flashinfer=flashinfer, cuda_version="13.0", platform="linux_x86_64",
        modules=[aot_wheel.Module(name="trtllm_comm", so=so, targets=(target,), info={},
                                  sources_digest=aot_wheel.own_digest(
                                      data / "csrc", data / "include"))],
        stack=STACK, toolkit_version="0", toolchain={})


def test_our_aot_wheel_installs_beside_a_stock_jit_cache_and_each_module_loads_from_its_own(
        built: Path, tmp_path: Path) -> None:
    """Issue 18.2: the AOT wheel is a distribution of its own; pip keeps upstream's
    jit-cache beside it (either order), our FlashInfer finds it through its added lookup
    (patch 0003) and aot-check's lookup says which module loads from where."""
    pytest.importorskip("torch")
    from sm120fork.aot import check
    from sm120fork.aot import wheel as aot_wheel

    probe_site = tmp_path / "probe"
    _install_flashinfer(built, probe_site)
    ours = _our_aot_wheel(built, probe_site, tmp_path, "sm_90a")
    stock = _stock_jit_cache_wheel(tmp_path, ["trtllm_comm", "norm", "sampling"])
    fi_wheel = next((built / STACK_WHEELS).glob("flashinfer_python-*.whl"))

    for order in ([stock, ours], [ours, stock]):
        venv = tmp_path / f"venv-{order[0].name[:9]}"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        for wheel in [fi_wheel, *order]:
            subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                            "-q", "--no-deps", "--no-compile", "--disable-pip-version-check",
                            str(wheel)],
                           check=True)
        listed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "list",
                                 "--format", "json", "--disable-pip-version-check"],
                                check=True, capture_output=True, text=True).stdout
        names = {d["name"].lower(): d["version"] for d in json.loads(listed)}
        assert names.get("flashinfer-jit-cache") == "0.6.7.post3+cu130", names
        assert names.get("sm120fork-flashinfer-aot") == "0.6.7.post3+sm120.1.cu130", names
        site = next((venv / "lib").glob("python3*/site-packages"))
        found = check.lookup(env={"PYTHONPATH": str(site),
                                  "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")},
                             specs=[*check.DEFAULT_SPECS, _STOCK_MODULES["norm"],
                                    _STOCK_MODULES["sampling"]])
        assert check.check_installed(aot_wheel.read_wheel(ours), found) == []
        modules = found.modules
        ours_dir = site / "sm120fork_flashinfer_aot" / "jit_cache"
        stock_dir = site / "flashinfer_jit_cache" / "jit_cache"
        assert Path(modules["trtllm_comm"].loads_from or "") == ours_dir / "trtllm_comm" / \
            "trtllm_comm.so"
        refused = [c for c in modules["trtllm_comm"].copies if not c.load]
        assert [Path(c.path) for c in refused] == [stock_dir / "trtllm_comm" /
                                                   "trtllm_comm.so"]
        for name in ("norm", "sampling"):
            assert Path(modules[name].loads_from or "") == stock_dir / name / f"{name}.so"
        text = "\n".join(check.describe(found))
        assert f"trtllm_comm: loads from {ours_dir}" in text
        assert "refused" in text


#: sglang 0.5.10.post1 pins torch==2.9.1; that torch on the package index is built for
#: CUDA 12.8 (torch.version.cuda), and it brings libcudart.so.12, not .13.
_STACK_TORCH = ("2.9.1", "12.8")

_OWN_TORCH_PROBE = r"""
import importlib, json, sys, types
import torch
torch.__version__, torch.version.cuda = sys.argv[2], sys.argv[3]
""" + _FLASHINFER_SITE.replace("import importlib, json, sys, types\n", "") + r"""
comm = importlib.import_module("flashinfer.jit.comm")
spec = comm.gen_trtllm_comm_module()
print(json.dumps({"aot": spec.is_aot, "library": str(spec.get_library_path())}))
"""


def test_the_aot_module_loads_on_the_stacks_own_torch_without_nvcc(
        built: Path, tmp_path: Path) -> None:
    """Issue 18.3: on the default stack's own torch (2.9.1, CUDA 12.8) with no nvcc, an
    SM12x box loads the AOT wheel's module (patch 0004), and the wheel requires the CUDA
    13 runtime its module links, which that torch does not bring."""
    pytest.importorskip("torch")
    from sm120fork.package.wheel import wheel_requirements

    sglang = next((built / STACK_WHEELS).glob("sglang-*.whl"))
    torch_pins = [r for r in wheel_requirements(sglang) if r.name == "torch"]
    assert [str(r.specifier) for r in torch_pins] == [f"=={_STACK_TORCH[0]}"]

    site = tmp_path / "site"
    _install_flashinfer(built, site)
    ours = _our_aot_wheel(built, site, tmp_path, "sm_120f")
    with zipfile.ZipFile(ours) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: nvidia-cuda-runtime>=13.0,<14" in metadata
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(site), str(ours)], check=True)

    no_nvcc = tmp_path / "no-cuda"
    no_nvcc.mkdir()
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "12.0", "CUDA_HOME": str(no_nvcc),
           "PATH": "/usr/bin:/bin", "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"),
           "PYTHONDONTWRITEBYTECODE": "1", "FLASHINFER_DISABLE_JIT": "1"}
    argv = [sys.executable, "-c", _OWN_TORCH_PROBE, str(site), f"{_STACK_TORCH[0]}+cu128",
            _STACK_TORCH[1]]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["aot"] is True
    assert Path(found["library"]) == (site / "sm120fork_flashinfer_aot" / "jit_cache" /
                                      "trtllm_comm" / "trtllm_comm.so")

    # Upstream's compilation context refuses SM 12.x by torch's CUDA version first.
    _put_upstream_file(built, site, "flashinfer/compilation_context.py")
    theirs = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    assert theirs.returncode != 0
    assert "SM 12.x requires CUDA >= 12.9" in theirs.stderr


# Which modules FlashInfer's own AOT build (flashinfer/aot.py, what flashinfer-jit-cache is
# made with) generates for each architecture given in argv[2:], comm modules on.
_AOT_MODULES_PROBE = _FLASHINFER_SITE.replace(
    'for name in ("flashinfer", "flashinfer.jit"):', 'for name in ("flashinfer",):') + r"""
import torch
aot = importlib.import_module("flashinfer.aot")
found = {}
for sm in sys.argv[2:]:
    specs = aot.gen_all_modules([torch.float16], [], [], [], [False], [False], {sm: True},
                                add_comm=True, add_gemma=False, add_oai_oss=False,
                                add_moe=False, add_act=False, add_misc=False, add_xqa=False)
    found[sm] = sorted(spec.name for spec in specs)
print(json.dumps(found))
"""


def _aot_modules(site: Path, tmp_path: Path, archs: list[str]) -> dict[str, list[str]]:
    # Only specs are generated (sources written under the workspace), nothing is compiled:
    # no nvcc, no GPU. The nvshmem paths are read, not opened.
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0a 12.0a 12.1a",
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "PYTHONDONTWRITEBYTECODE": "1",
           "NVSHMEM_INCLUDE_PATH": str(tmp_path / "nvshmem" / "include"),
           "NVSHMEM_LIBRARY_PATH": str(tmp_path / "nvshmem" / "lib")}
    done = subprocess.run([sys.executable, "-c", _AOT_MODULES_PROBE, str(site), *archs],
                          capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_an_aot_build_for_sm90_or_sm12x_ships_the_trtllm_comm_module(
        built: Path, tmp_path: Path) -> None:
    """Patch 0003 (F2): FlashInfer's AOT build (flashinfer/aot.py gen_all_modules) includes
    the trtllm comm module when its targets are SM90, SM120 or SM121 alone; upstream's adds
    it only with SM100, so a jit-cache for those architectures shipped none."""
    pytest.importorskip("torch")  # flashinfer/aot.py imports it
    archs = ["sm90", "sm120", "sm121"]
    site = tmp_path / "site"
    _install_flashinfer(built, site)
    ours = _aot_modules(site, tmp_path, archs)
    assert {sm: "trtllm_comm" in names for sm, names in ours.items()} == dict.fromkeys(
        archs, True)
    _put_upstream_file(built, site, "flashinfer/aot.py")
    theirs = _aot_modules(site, tmp_path, archs)
    assert {sm: "trtllm_comm" in names for sm, names in theirs.items()} == dict.fromkeys(
        archs, False)
    # Otherwise the two builds generate the same modules for these targets.
    assert {sm: sorted(set(n) - {"trtllm_comm"}) for sm, n in ours.items()} == theirs
