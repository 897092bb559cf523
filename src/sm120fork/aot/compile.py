"""Compile FlashInfer's trtllm comm module ahead of time, the way FlashInfer's AOT does: a
probe points ``flashinfer.jit.env`` at the tree and runs ``build_jit_specs`` on the tree's own
``gen_trtllm_comm_module()``.  The result is cached under a key over the ninja file, the
sources and the compiler.  A build machine has no driver, and not every toolkit ships
``libcuda.so`` stubs or an unversioned ``libcudart.so``: a link directory supplies them.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sm120fork.cuda.cubin import probe
from sm120fork.cuda.toolkit import require_nvcc
from sm120fork.errors import BuildError, ConfigError
from sm120fork.util import proc, typed
from sm120fork.util.files import staged_dir
from sm120fork.util.hint import command

log = logging.getLogger("sm120fork")

MODULE = "trtllm_comm"
_STUB_SOURCE = "/* libcuda.so link stub: the real driver library is found at run time. */\n"


#: The compute capabilities built for: Hopper, the Blackwell datacenter family (B200, B300),
#: Thor, RTX PRO 6000 / RTX 50xx and DGX Spark.  FlashInfer's own compilation context turns
#: them into targets (every 12.x -> sm_120f).  Thor (11.0) is listed so that a module gate
#: that refuses it says so.
DEFAULT_CAPABILITIES: tuple[str, ...] = ("9.0", "10.0", "10.3", "11.0", "12.0", "12.1")

_CAPABILITY = re.compile(r"^(\d+)\.(\d)$")
_GENCODE = re.compile(r"^-gencode=arch=compute_(\w+),code=sm_(\w+)$")


def parse_capabilities(items: Sequence[str]) -> tuple[str, ...]:
    """``["9.0", "12.0"]`` -> validated, de-duplicated, in order."""
    for item in items:
        if not _CAPABILITY.match(item.strip()):
            raise ConfigError(f"not a compute capability: {item!r}", where="--capabilities",
                              fix="write MAJOR.MINOR, e.g. 9.0,10.0,12.0")
    if not items:
        raise ConfigError("no compute capabilities given", where="--capabilities")
    return tuple(dict.fromkeys(item.strip() for item in items))


def arch_list(capabilities: Sequence[str]) -> str:
    """The ``FLASHINFER_CUDA_ARCH_LIST`` value (space separated, FlashInfer normalises)."""
    return " ".join(capabilities)


def targets_from_flags(flags: Sequence[str]) -> tuple[str, ...]:
    """``-gencode=arch=compute_90a,code=sm_90a`` ... -> ``("sm_90a", ...)`` in flag order."""
    found = (f"sm_{match.group(2)}" for flag in flags if (match := _GENCODE.match(flag)))
    return tuple(dict.fromkeys(found))


def sources_root(tree: Path) -> Path:
    """The folder holding ``csrc/`` and ``include/``: the tree itself (an sdist or fork
    tree) or ``flashinfer/data`` (a published wheel, unpacked)."""
    for root in (tree, tree / "flashinfer" / "data"):
        if (root / "csrc").is_dir() and (tree / "flashinfer" / "jit").is_dir():
            return root
    raise ConfigError("not FlashInfer sources (no csrc/ or flashinfer/data/csrc/, or no "
                      "flashinfer/jit/)", where=str(tree),
                      fix=f"run `{command('build')}` first to make the fork tree")


_PROBE = r"""
import os

tree, build_dir = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
mode, mark = sys.argv[3], sys.argv[4]
fake_flashinfer(tree / "flashinfer")
jit_env = importlib.import_module("flashinfer.jit.env")
# As flashinfer/aot.py compile_and_package_modules: sources from the tree, work in build_dir.
# A published wheel (no csrc/ at the top) keeps env.py's own paths into flashinfer/data/.
if (tree / "csrc").is_dir():
    jit_env.FLASHINFER_CSRC_DIR = tree / "csrc"
    jit_env.FLASHINFER_INCLUDE_DIR = tree / "include"
    jit_env.CUTLASS_INCLUDE_DIRS = [tree / "3rdparty" / "cutlass" / "include",
                                    tree / "3rdparty" / "cutlass" / "tools" / "util" / "include"]
    jit_env.SPDLOG_INCLUDE_DIR = tree / "3rdparty" / "spdlog" / "include"
jit_env.FLASHINFER_WORKSPACE_DIR = build_dir
jit_env.FLASHINFER_JIT_DIR = build_dir / "cached_ops"
jit_env.FLASHINFER_GEN_SRC_DIR = build_dir / "generated"
core = importlib.import_module("flashinfer.jit.core")
cpp_ext = importlib.import_module("flashinfer.jit.cpp_ext")
comm = importlib.import_module("flashinfer.jit.comm")
version = importlib.import_module("flashinfer.version").__version__
import tvm_ffi
try:
    spec = comm.gen_trtllm_comm_module()
except Exception as exc:
    print(mark + json.dumps({"refused": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
ninja = cpp_ext.generate_ninja_build_for_op(
    name=spec.name, sources=spec.sources, extra_cflags=spec.extra_cflags,
    extra_cuda_cflags=spec.extra_cuda_cflags, extra_ldflags=spec.extra_ldflags,
    extra_include_dirs=spec.extra_include_dirs, needs_device_linking=spec.needs_device_linking)
result = {"name": spec.name, "sources": [str(s) for s in spec.sources],
          "cuda_flags": list(spec.extra_cuda_cflags or []), "ninja": ninja,
          "flashinfer_version": version, "tvm_ffi_version": tvm_ffi.__version__,
          "arch_list": os.environ.get("FLASHINFER_CUDA_ARCH_LIST"), "prefix": sys.prefix}
if mode == "build":
    jit_env.FLASHINFER_JIT_DIR.mkdir(parents=True, exist_ok=True)
    jit_env.FLASHINFER_GEN_SRC_DIR.mkdir(parents=True, exist_ok=True)
    core.build_jit_specs([spec], verbose=True, skip_prebuilt=False)
    result["so"] = str(spec.jit_library_path)
print(mark + json.dumps(result))
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """What FlashInfer's JIT would build for these capabilities (no compiling yet)."""

    module: str
    arch_list: str
    targets: tuple[str, ...]
    sources: tuple[str, ...]
    cuda_flags: tuple[str, ...]
    ninja: str
    flashinfer_version: str
    tvm_ffi_version: str
    prefix: str  # the build interpreter's sys.prefix (left out of the cache key)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseTime:
    """One row of nvcc's ``--time`` table: a pass over one source for one target."""

    source: str
    phase: str
    target: str
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Compiled:
    """A built module: the shared library and how it was made."""

    plan: Plan
    so: Path
    key: str
    cached: bool
    wall_seconds: float
    phases: tuple[PhaseTime, ...]
    toolchain: str
    jobs: int

    def seconds_per_target(self) -> dict[str, float]:
        """Device passes (preprocess, cicc, ptxas) summed per target, over all sources."""
        targets = dict.fromkeys(p.target for p in self.phases if p.target)
        return {t: sum(p.seconds for p in self.phases if p.target == t) for t in targets}

    def to_dict(self) -> dict[str, object]:
        return {"module": self.plan.module, "arch_list": self.plan.arch_list,
                "targets": list(self.plan.targets), "key": self.key, "cached": self.cached,
                "wall_seconds": round(self.wall_seconds, 1), "jobs": self.jobs,
                "toolchain": self.toolchain,
                "flashinfer_version": self.plan.flashinfer_version,
                "tvm_ffi_version": self.plan.tvm_ffi_version,
                "seconds_per_target": {k: round(v, 1)
                                       for k, v in self.seconds_per_target().items()},
                "host_seconds": round(sum(p.seconds for p in self.phases if not p.target), 1),
                "sources": list(self.plan.sources), "cuda_flags": list(self.plan.cuda_flags)}


def parse_nvcc_times(text: str) -> tuple[PhaseTime, ...]:
    """nvcc ``--time`` CSV (several nvcc processes append to it) -> its rows; host passes
    carry target ``""`` even where nvcc labels them with the last target."""
    rows: list[PhaseTime] = []
    for record in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in record]
        # not a pass: the header, the "nvcc (driver)" summary row (no source)
        if len(cells) < 8 or cells[0] in ("", "source file name") or cells[7] != "ms":
            continue
        try:
            ms = float(cells[6])
        except ValueError:
            continue
        # a device pass names its target compute_XY (cicc, preprocess) or sm_XY (ptxas)
        device = cells[1] in ("gcc (preprocessing 1)", "cicc", "ptxas") and cells[4]
        rows.append(PhaseTime(source=Path(cells[0]).name, phase=cells[1],
                              target="sm_" + cells[4].split("_", 1)[1] if device else "",
                              seconds=ms / 1000))
    return tuple(rows)


class NinjaProgress:
    """Each ninja step of the module build as one log line: which file, for which targets,
    how far (``[3/12] nvcc ... -gencode=arch=compute_120f,code=sm_120f ... x.cu``)."""

    _STEP = re.compile(r"^\[(\d+)/(\d+)\]\s")
    _SOURCE = re.compile(r"(\S+\.(?:cu|cpp|cc))\b")
    _TARGET = re.compile(r"code=(sm_\w+)")

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, line: str) -> None:
        text = line.strip()
        if not (step := self._STEP.match(text)):
            return
        source = self._SOURCE.search(text)
        targets = list(dict.fromkeys(self._TARGET.findall(text)))
        what = Path(source.group(1)).name if source else text[step.end():][:60]
        log.info("AOT build step %s/%s after %.0f s: %s%s", step.group(1), step.group(2),
                 time.monotonic() - self.started, what,
                 f" ({', '.join(targets)})" if targets else "")


def _probe(tree: Path, build_dir: Path, mode: str, env: Mapping[str, str]) -> tuple[Plan, str]:
    """The probe's answer, read once: the plan of FlashInfer's JIT and (``build``) the
    module it built; BuildError when the JIT refuses."""
    log.info("+ FLASHINFER_CUDA_ARCH_LIST=%r %s -c <FlashInfer %s probe> %s %s",
             env.get("FLASHINFER_CUDA_ARCH_LIST"), sys.executable, mode, tree, build_dir)
    result = probe(sys.executable, _PROBE, tree, build_dir, mode, what="the FlashInfer build "
                   "probe", where=str(tree), error=BuildError, env=env,
                   cwd=build_dir, on_line=NinjaProgress() if mode == "build" else None)
    if "refused" in result:
        raise BuildError(f"FlashInfer's JIT refuses {MODULE} for "
                         f"{env.get('FLASHINFER_CUDA_ARCH_LIST')}: {result['refused']}",
                         where=str(tree))
    so = str(result.pop("so", ""))
    result["module"] = result.pop("name")
    result["targets"] = list(targets_from_flags(result["cuda_flags"]))
    return typed.read(Plan, result, str(tree)), so


@dataclasses.dataclass(frozen=True, kw_only=True)
class Toolchain:
    """``cuda_home`` holds ``bin/nvcc``; ``link_dir`` what the linker needs besides it."""

    cuda_home: Path
    nvcc: Path
    version: str
    version_text: str
    link_dir: Path
    source: str  # "system" or "pip"

    def env(self) -> dict[str, str]:
        """What FlashInfer's JIT reads to find and link with this toolkit."""
        lib_dirs = [d for d in (self.cuda_home / "lib64", self.cuda_home / "lib") if d.is_dir()]
        flags = [f"-L{d}" for d in (*lib_dirs, self.link_dir)]
        path = os.pathsep.join([str(self.cuda_home / "bin"), os.environ.get("PATH", "")])
        return {"CUDA_HOME": str(self.cuda_home), "PATH": path,
                "FLASHINFER_EXTRA_LDFLAGS": " ".join(flags)}


def prepare(link_dir: Path) -> Toolchain:
    """Locate the toolkit (the one nvcc locator, pip's ``nvidia-cuda-nvcc`` included) and
    fill ``link_dir`` with the stubs FlashInfer's link needs."""
    nvcc = require_nvcc(pip=True, fix="pip install -r aot/requirements-build.txt (the CUDA "
                        "toolchain from the package index) or install the CUDA toolkit")
    home, source = nvcc.home, "pip" if nvcc.found_in == "pip" else "system"
    link_dir.mkdir(parents=True, exist_ok=True)
    link_dir = link_dir.resolve()  # the link runs in the build's work folder
    has_cudart = any((home / lib / "libcudart.so").exists() for lib in ("lib64", "lib"))
    if not has_cudart:
        versioned = next((p for lib in ("lib64", "lib")
                          for p in sorted((home / lib).glob("libcudart.so.[0-9]*"))), None)
        if versioned is None:
            raise ConfigError("the CUDA toolkit has no libcudart.so", where=str(home),
                              fix="install nvidia-cuda-runtime of the same CUDA version")
        link = link_dir / "libcudart.so"
        link.unlink(missing_ok=True)
        link.symlink_to(versioned)
    has_driver = any((home / d / "libcuda.so").exists() for d in ("lib64/stubs", "lib/stubs"))
    if not has_driver and not (link_dir / "libcuda.so").exists():
        stub_c = link_dir / "libcuda_stub.c"
        stub_c.write_text(_STUB_SOURCE)
        cc = os.environ.get("CC", "cc")
        proc.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                  link_dir / "libcuda.so", stub_c], quiet=True)
    return Toolchain(cuda_home=home, nvcc=nvcc.path, version=nvcc.version,
                     version_text=nvcc.version_text, link_dir=link_dir, source=source)


def _base_env(toolchain: Toolchain, arch_list: str, build_dir: Path, jobs: int,
              cuda_flags: str = "") -> dict[str, str]:
    return {**toolchain.env(), "FLASHINFER_CUDA_ARCH_LIST": arch_list,
           "FLASHINFER_WORKSPACE_BASE": str(build_dir / "workspace"),
           "FLASHINFER_EXTRA_CUDAFLAGS": cuda_flags, "FLASHINFER_JIT_VERBOSE": "0",
           "FLASHINFER_JIT_DEBUG": "0", "PYTHONDONTWRITEBYTECODE": "1",
           "MAX_JOBS": str(jobs)}


def tree_digest(tree: Path) -> str:
    """sha256 over every file (path and content) under the tree's C++ source folders."""
    digest = hashlib.sha256()
    in_tree = sources_root(tree) == tree
    for name in ("csrc", "include", "3rdparty") if in_tree else ("flashinfer/data",):
        # (a folder the tree lacks adds nothing)
        for path in sorted(p for p in (tree / name).rglob("*")
                           if p.is_file() and ".git" not in p.parts):
            digest.update(path.relative_to(tree).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def cache_key(plan_: Plan, tree: Path, scratch: Path, toolchain: Toolchain) -> str:
    """Changes when anything that goes into the .so does: flags, paths' contents, nvcc."""
    ninja = (plan_.ninja.replace(str(tree.resolve()), "<tree>")
             .replace(str(scratch.resolve()), "<build>").replace(plan_.prefix, "<python>"))
    parts = {"ninja": ninja, "tree": tree_digest(tree), "nvcc": toolchain.version_text,
             "tvm_ffi": plan_.tvm_ffi_version}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def build(tree: Path, capabilities: Sequence[str], toolchain: Toolchain, cache: Path, *,
          jobs: int = 2, rebuild: bool = False) -> Compiled:
    """Compile (or reuse) the module for ``capabilities``; returns where its .so is."""
    # nvcc and the probe run in the work folder: every path they get is absolute.
    tree, cache = tree.resolve(), cache.resolve()
    sources_root(tree)
    archs = arch_list(capabilities)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="plan-", dir=cache) as tmp:
        scratch = Path(tmp)
        env = _base_env(toolchain, archs, scratch, 1)
        planned = _probe(tree, scratch, "plan", env)[0]
        key = cache_key(planned, tree, scratch, toolchain)
    done = cache / key
    record = done / "compiled.json"
    if record.is_file() and not rebuild:
        data = json.loads(record.read_text())
        log.info("%s for %s: cached (%s)", MODULE, " ".join(planned.targets), key)
        return Compiled(plan=planned, so=done / f"{MODULE}.so", key=key, cached=True,
                        wall_seconds=data["wall_seconds"], jobs=data["jobs"],
                        toolchain=data["toolchain"],
                        phases=tuple(PhaseTime(**p) for p in data["phases"]))
    # One work folder per key: builds for other targets can run beside this one.
    work = cache / f"work-{key}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    times = work / "nvcc-time.csv"
    env = _base_env(toolchain, archs, work, jobs, f"--time={times}")
    log.info("compiling %s for %s (%s, %d jobs): this takes minutes per target",
             MODULE, " ".join(planned.targets), toolchain.version_text, jobs)
    started = time.monotonic()
    so = Path(_probe(tree, work, "build", env)[1])
    wall = time.monotonic() - started
    if not so.name or not so.is_file():
        raise BuildError(f"FlashInfer's build reported no {so.name or 'module'}", where=str(work))
    phases = parse_nvcc_times(times.read_text() if times.is_file() else "")
    compiled = Compiled(plan=planned, so=done / so.name, key=key, cached=False,
                        wall_seconds=wall, phases=phases, toolchain=toolchain.version_text,
                        jobs=jobs)
    with staged_dir(done) as tmp:
        tmp.mkdir()
        shutil.copy2(so, tmp / so.name)
        (tmp / "build.ninja").write_text(planned.ninja)
        (tmp / "compiled.json").write_text(json.dumps(
            {**compiled.to_dict(), "phases": [dataclasses.asdict(p) for p in phases]}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    log.info("%s built in %.0f s: %s", MODULE, wall, compiled.seconds_per_target())
    return compiled
