"""build-aot refuses a FlashInfer tree or manifest that is not the published wheel's."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers_manifest import entry, write_manifest
from sm120fork.aot import compile as compile_mod
from sm120fork.aot import pipeline, wheel
from sm120fork.cuda.cubin import PROBE_MARK
from sm120fork.declare import load_stacks
from sm120fork.errors import ConfigError
from sm120fork.util import proc
from sm120fork.workspace import Workspace

from conftest import git

REPO = Path(__file__).resolve().parents[2]


def _manifest(path: Path, **changes: object) -> None:
    fields: dict[str, object] = {
        "distribution": "flashinfer-python", "version": "0.6.7.post3+sm120.1",
        "wheel": "w.whl", "sha256": "a" * 64, "tree": "b" * 40, "patched_commit": "c" * 40,
        "upstream_version": "0.6.7.post3", "series_digest": "d" * 64}
    write_manifest(path, "sglang-0.5.10", entry("flashinfer", **{**fields, **changes}))


def test_the_flashinfer_entry_of_the_stacks_manifest(tmp_path: Path) -> None:
    stack = load_stacks(REPO / "forks")["sglang-0.5.10"]
    _manifest(tmp_path)
    build = pipeline.flashinfer_build(tmp_path, stack)
    assert build.version == "0.6.7.post3+sm120.1"
    assert build.sha256 == "a" * 64
    with pytest.raises(ConfigError, match=r"no readable manifest\.json"):
        pipeline.flashinfer_build(tmp_path / "none", stack)
    other = load_stacks(REPO / "forks")["flashinfer-0.7.4"]
    with pytest.raises(ConfigError, match=r"not 'flashinfer-0\.7\.4'"):
        pipeline.flashinfer_build(tmp_path, other)
    _manifest(tmp_path / "short", sha256=None)
    data = json.loads((tmp_path / "short" / "manifest.json").read_text())
    del data["wheels"][0]["sha256"]
    (tmp_path / "short" / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="not a build manifest: is missing") as err:
        pipeline.flashinfer_build(tmp_path / "short", stack)
    assert err.value.where is not None
    assert err.value.where.endswith("manifest.json: wheels[0].sha256")


def test_tree_hash_is_heads_tree_and_refuses_local_changes(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "-q")
    (tree / "a.cu").write_text("x")
    git(tree, "add", "a.cu")
    git(tree, "commit", "-qm", "one")
    assert pipeline.tree_hash(tree) == git(tree, "rev-parse", "HEAD^{tree}")
    (tree / "a.cu").write_text("changed")
    with pytest.raises(ConfigError, match="uncommitted changes"):
        pipeline.tree_hash(tree)


def test_the_lookup_comes_from_the_flashinfer_sources(tmp_path: Path) -> None:
    """How a FlashInfer finds the AOT wheel is read from its env.py, not from a stack name:
    the default stack's series adds ``flashinfer.prebuilt`` (patch 0009); 0.7.x as published
    asks upstream's jit-cache shim for providers; a FlashInfer with neither is refused."""
    env = tmp_path / "flashinfer" / "jit" / "env.py"
    env.parent.mkdir(parents=True)
    env.write_text("FLASHINFER_AOT_DIR = _package_root / 'data' / 'aot'\n")
    with pytest.raises(ConfigError, match="no lookup for prebuilt-module packages"):
        wheel.of_tree(tmp_path, "s")
    patch = next((REPO / "patches" / "sglang-0.5.10" / "flashinfer").glob("0009-*.patch"))
    assert '+PREBUILT_ENTRY_POINT_GROUP = "flashinfer.prebuilt"' in patch.read_text()
    env.write_text('PREBUILT_ENTRY_POINT_GROUP = "flashinfer.prebuilt"\n')
    assert wheel.of_tree(tmp_path, "s") is wheel.PREBUILT
    env.write_text("    for provider in flashinfer_jit_cache.get_jit_cache_providers():\n")
    assert wheel.of_tree(tmp_path, "s") is wheel.JIT_CACHE_PROVIDERS


def _published_flashinfer(root: Path, env_text: str) -> tuple[Path, str]:
    """A stand-in of a published FlashInfer wheel (its JIT sources under flashinfer/data)."""
    wheel = root / "flashinfer_python-0.7.2-py3-none-any.whl"
    root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("flashinfer/jit/env.py", env_text)
        zf.writestr("flashinfer/data/csrc/trtllm_allreduce.cu", "kernels")
        zf.writestr("flashinfer/data/include/flashinfer/comm.cuh", "header")
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


def _stack_root(tmp_path: Path) -> Workspace:
    root = tmp_path / "root"
    shutil.copytree(REPO / "forks", root / "forks")
    shutil.copytree(REPO / "patches" / "sglang-0.5.23", root / "patches" / "sglang-0.5.23")
    return Workspace(root)


def test_build_aot_for_a_flashinfer_used_as_published(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18.3, stack sglang-0.5.23: no fork tree, the published 0.7.2 wheel (checked by
    its sha256) is the module's source, and the wheel is a provider of upstream's jit-cache
    shim, requiring that shim at its own version (FlashInfer takes a provider only then)."""
    ws = _stack_root(tmp_path)
    stack = ws.stack("sglang-0.5.23")
    wheels = ws.stack_wheels(stack.name)
    published, sha = _published_flashinfer(
        wheels, "for provider in flashinfer_jit_cache.get_jit_cache_providers():\n")
    write_manifest(wheels, stack.name, entry(
        "flashinfer", distribution="flashinfer-python", version="0.7.2",
        upstream_version="0.7.2", used_as_published=True, wheel=published.name, sha256=sha,
        series_digest="e3" * 32))
    seen: dict[str, Path] = {}

    def compile_stand_in(tree: Path, capabilities: object, toolchain: object, cache: Path,
                         **_: object) -> compile_mod.Compiled:
        seen["tree"] = tree
        so = cache / "trtllm_comm.so"
        so.parent.mkdir(parents=True, exist_ok=True)
        so.write_bytes(b"\x7fELF stand-in")
        plan = compile_mod.Plan(module="trtllm_comm", arch_list="12.0 12.1",
                                targets=("sm_120f", "sm_121a"), sources=(), cuda_flags=(),
                                ninja="", flashinfer_version="0.7.2", tvm_ffi_version="0",
                                prefix="")
        return compile_mod.Compiled(plan=plan, so=so, key="k", cached=False, wall_seconds=0,
                                    phases=(), toolchain="nvcc 13.0", jobs=1)

    toolchain = SimpleNamespace(version="13.0", version_text="nvcc 13.0", source="system")
    monkeypatch.setattr("sm120fork.aot.compile.prepare", lambda link: toolchain)
    monkeypatch.setattr("sm120fork.aot.compile.build", compile_stand_in)
    monkeypatch.setattr("sm120fork.aot.check.embedded_code", lambda so: [])
    monkeypatch.setattr("sm120fork.aot.check.check_module", lambda code: [])
    built = pipeline.build_aot(ws, stack, capabilities=("12.0", "12.1"),
                               platform="linux_x86_64")

    assert (seen["tree"] / "flashinfer" / "data" / "csrc" / "trtllm_allreduce.cu").is_file()
    assert built.wheel.parent == ws.wheels_dir / "aot" / "sglang-0.5.23"
    assert built.wheel.name == "sm120fork_flashinfer_aot-0.7.2+cu130-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(built.wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith("METADATA"))).decode()
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt")))
    assert "Requires-Dist: flashinfer-python==0.7.2\n" in metadata
    assert "Requires-Dist: flashinfer-jit-cache==0.7.2+cu130\n" in metadata
    assert "Requires-Dist: nvidia-cuda-runtime>=13.0,<14\n" in metadata
    assert entry_points.decode() == ("[flashinfer.jit_cache.providers]\n"
                                     "sm120fork = sm120fork_flashinfer_aot:get_provider\n")
    assert built.manifest.flashinfer.tree is None
    assert built.manifest.lookup.name == "jit-cache-providers"

    # The published wheel is the source only while it is the one the stack pins.
    published.write_bytes(published.read_bytes() + b"\0")
    with pytest.raises(ConfigError, match=r"not the wheel manifest\.json pins"):
        pipeline.build_aot(ws, stack, capabilities=("12.0",), platform="linux_x86_64")


def test_a_published_flashinfer_without_a_lookup_gets_no_aot_wheel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FlashInfer that never looks in a package of another name: refused before compiling."""
    ws = _stack_root(tmp_path)
    stack = ws.stack("sglang-0.5.23")
    wheels = ws.stack_wheels(stack.name)
    published, sha = _published_flashinfer(wheels, "FLASHINFER_AOT_DIR = 'data/aot'\n")
    write_manifest(wheels, stack.name, entry(
        "flashinfer", distribution="flashinfer-python", version="0.7.2",
        upstream_version="0.7.2", used_as_published=True, wheel=published.name, sha256=sha,
        series_digest="e3" * 32))
    monkeypatch.setattr("sm120fork.aot.compile.prepare",
                        lambda link: pytest.fail("compiled without a lookup"))
    with pytest.raises(ConfigError, match="no lookup for prebuilt-module packages"):
        pipeline.build_aot(ws, stack, platform="linux_x86_64")



def test_the_module_build_names_absolute_paths_as_it_runs_in_its_work_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree and cache named relative to the caller's folder (as
    a caller may name them) are the same places for the probe and for
    nvcc, which run in the work folder: the probe's arguments, its workspace and nvcc's
    --time file are absolute."""
    (tmp_path / "work" / "site").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    calls: list[dict[str, object]] = []

    def run(cmd: list[object], **kw: object) -> SimpleNamespace:
        calls.append({"argv": [str(c) for c in cmd], "cwd": kw.get("cwd"),
                      "env": dict(kw.get("env") or {})})  # type: ignore[call-overload]
        if len(calls) > 1:
            raise RuntimeError("stop after the build probe's call")
        result = {"name": "trtllm_comm", "cuda_flags": ["-gencode=arch=compute_90a,code=sm_90a"],
                  "sources": [], "ninja": "", "flashinfer_version": "0",
                  "tvm_ffi_version": "0", "arch_list": "9.0a", "prefix": "/p"}
        return SimpleNamespace(stdout=PROBE_MARK + json.dumps(result) + "\n", stderr="")

    monkeypatch.setattr(proc, "run", run)
    monkeypatch.setattr(compile_mod, "sources_root", lambda tree: tree)
    monkeypatch.setattr(compile_mod, "cache_key", lambda *a: "k")
    chain = SimpleNamespace(env=lambda: {}, version_text="nvcc")
    with pytest.raises(RuntimeError, match="stop after"):
        compile_mod.build(Path("work/site"), ["9.0a"], chain,  # type: ignore[arg-type]
                          Path("work/cache"), jobs=1)
    assert len(calls) == 2
    for call in calls:
        argv, env, cwd = call["argv"], call["env"], call["cwd"]
        assert isinstance(argv, list)
        assert isinstance(env, dict)
        assert isinstance(cwd, Path)
        assert argv[3] == str(tmp_path / "work" / "site")
        assert Path(argv[4]).is_absolute()
        assert cwd.is_absolute()
        assert Path(env["FLASHINFER_WORKSPACE_BASE"]).is_absolute()
    build_env = calls[1]["env"]
    assert isinstance(build_env, dict)
    assert build_env["FLASHINFER_EXTRA_CUDAFLAGS"] == (
        f"--time={tmp_path / 'work' / 'cache' / 'work-k' / 'nvcc-time.csv'}")


def test_a_compiled_module_is_kept_whole_under_its_key_and_served_from_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The .so, its build.ninja and compiled.json land under the cache key together (the
    work folder goes); the next build for the same key compiles nothing."""
    (tmp_path / "site").mkdir()
    builds: list[Path] = []

    def run(cmd: list[object], **kw: object) -> SimpleNamespace:
        result = {"name": "trtllm_comm", "cuda_flags": [], "sources": [], "ninja": "rules",
                  "flashinfer_version": "0", "tvm_ffi_version": "0", "arch_list": "12.0a",
                  "prefix": "/p"}
        if cmd[5] == "build":
            so = Path(str(cmd[4])) / "trtllm_comm.so"
            so.write_bytes(b"\x7fELF")
            builds.append(so)
            result["so"] = str(so)
        return SimpleNamespace(stdout=PROBE_MARK + json.dumps(result) + "\n", stderr="")

    monkeypatch.setattr(proc, "run", run)
    monkeypatch.setattr(compile_mod, "sources_root", lambda tree: tree)
    monkeypatch.setattr(compile_mod, "cache_key", lambda *a: "k")
    chain = SimpleNamespace(env=lambda: {}, version_text="nvcc")
    cache = tmp_path / "cache"
    first = compile_mod.build(tmp_path / "site", ["12.0a"], chain,  # type: ignore[arg-type]
                              cache, jobs=1)
    assert (first.cached, first.so) == (False, cache / "k" / "trtllm_comm.so")
    assert sorted(p.name for p in (cache / "k").iterdir()) == [
        "build.ninja", "compiled.json", "trtllm_comm.so"]
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith("plan-")) == ["k"]
    again = compile_mod.build(tmp_path / "site", ["12.0a"], chain,  # type: ignore[arg-type]
                              cache, jobs=1)
    assert (again.cached, again.so, len(builds)) == (True, first.so, 1)
