"""What the GPU verbs share: install the variants, build their modules, find the run's
environment and output folder."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Self

from sm120fork import manifest as manifest_file
from sm120fork import record
from sm120fork.cuda.toolkit import locate_nvcc
from sm120fork.errors import CommandError, ConfigError, UsageError
from sm120fork.gpu.core import records, report, variants
from sm120fork.gpu.core.documents import Environment
from sm120fork.gpu.core.safety import check_backend
from sm120fork.gpu.core.variants import ModuleBuild
from sm120fork.util import portable, proc

if TYPE_CHECKING:  # a GPU box runs these verbs without the checkout's stages (GitPython)
    from sm120fork.resolved import ResolvedStack

log = logging.getLogger("sm120fork")


DEFAULT_WORK_DIR = Path(os.environ.get("SM120FORK_GPU_WORK", "/tmp/sm120fork-gpu"))


def parse_variant_specs(specs: Sequence[str]) -> dict[str, Path]:
    """``NAME=DIR_OR_WHEEL`` options -> {name: path}, names unique."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"bad variant {spec!r}", where="--wheel-dir",
                              fix="write NAME=DIR, e.g. patched=wheels/sglang-0.5.10")
        if name in out:
            raise ConfigError(f"variant {name!r} given twice", where="--wheel-dir")
        out[name] = Path(path)
    return out


def variant_args(p: argparse.ArgumentParser) -> None:
    """The FlashInfer builds a run installs, and where (test, bench, upstream-tests, tune)."""
    p.add_argument("--wheel-dir", action="append", default=[], metavar="NAME=DIR",
                   help="a variant: a flashinfer_python wheel, or a directory holding one; "
                   "repeat for A/B, e.g. patched=wheels/STACK unpatched=up/")
    p.add_argument("--prebuilt", action="append", default=[], metavar="NAME=DIR",
                   help="FlashInfer modules prebuilt for variant NAME (DIR holds "
                   "<module>/<module>.so); if they fail to load, the run JIT-compiles")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                   help="installs, JIT caches (kept between runs) and raw logs")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:

    command: str  # recorded in the reports
    #: {variant: its wheel, or a folder holding one} (``--wheel-dir NAME=PATH``)
    wheel_dirs: Mapping[str, Path] = dataclasses.field(default_factory=dict)
    prebuilt: Mapping[str, Path] = dataclasses.field(default_factory=dict)
    quick: bool = False
    out: Path | None = None
    work_dir: Path = DEFAULT_WORK_DIR
    backend: str = "trtllm"
    allow_multicast: bool = False
    startup_timeout: float = 300.0
    case_timeout: float = 90.0
    compile_timeout: float = 1200.0
    #: Seconds after the module build past which no case starts (the run is then partial).
    time_budget: float | None = None
    not_run: tuple[str, ...] = ()
    allow_partial: bool = False
    #: ``--stack``, resolved where the command starts: its built wheels (and upstream's)
    stack: ResolvedStack | None = None
    world_sizes: tuple[int, ...] | None = None
    tokens: tuple[int, ...] | None = None
    hidden: tuple[int, ...] | None = None
    record_command: str | None = None
    #: The record's ``tested`` block (``--stack``); else tested.json beside the wheel.
    tested: record.Tested | None = None

    def with_stack(self, *, baseline: bool) -> Self:
        """``--stack``: the variants from the stack's build and pin (no --wheel-dir)."""
        if self.stack is None:
            return self
        if self.wheel_dirs:
            raise UsageError("--stack and --wheel-dir exclude each other",
                              fix="pass one of them")
        from sm120fork.gpu.core import stack_wheels

        found = stack_wheels.resolve(self.stack, baseline=baseline)
        notes = (*self.not_run, found.note) if found.note else self.not_run
        return dataclasses.replace(self, wheel_dirs=found.wheels, not_run=notes,
                                   tested=found.tested)

    def timeouts(self) -> variants.Timeouts:
        """The cases' limits; the budget counts from now (after the module build)."""
        deadline = None if self.time_budget is None else time.monotonic() + self.time_budget
        return variants.Timeouts(startup=self.startup_timeout, idle=self.case_timeout,
                                 deadline=deadline)


def _nvidia_smi() -> Environment:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = proc.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       timeout=30, quiet=True).stdout
    except CommandError:
        return {}
    rows = [line.split(", ") for line in out.strip().splitlines() if line]
    return {"driver": rows[0][1]} if rows and len(rows[0]) > 1 else {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prepared:
    """The run folder, the installed variants and their module build (outside the budget)."""

    run_dir: Path
    variants: list[variants.Variant]
    compiled: dict[str, ModuleBuild]
    module_seconds: float


def prepare(opts: RunOptions, what: str, modules: Sequence[str]) -> Prepared:
    """Install every variant and build (or load) its modules; returns the run folder too."""
    check_backend(opts.backend, allow_multicast=opts.allow_multicast,
                  host_environ=os.environ)
    specs, work = opts.wheel_dirs, opts.work_dir
    run_dir = work / "runs" / f"{what}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    if unknown := sorted(set(opts.prebuilt) - set(specs)):
        raise UsageError(f"--prebuilt for unknown variants {unknown}", where="--prebuilt")
    installed = [variants.install_variant(name, path, work, opts.prebuilt.get(name))
                 for name, path in (specs.items() if specs else [("installed", None)])]
    log.info("building/loading FlashInfer modules %s for %s (cached under %s)", modules,
             [v.name for v in installed], work)
    started = time.monotonic()
    compiled = variants.compile_variants(installed, run_dir, modules=modules,
                                         timeout=opts.compile_timeout)
    retry = [i for i, v in enumerate(installed)
             if v.aot_modules and not compiled[v.name].ok]
    if retry:
        for i in retry:
            log.warning("variant %s: prebuilt modules failed to load, JIT-compiling:\n%s",
                        installed[i].name, "\n".join(compiled[installed[i].name].tail))
            installed[i] = installed[i].without_prebuilt()
        again = variants.compile_variants([installed[i] for i in retry], run_dir,
                                          modules=modules, timeout=opts.compile_timeout)
        for name, info in again.items():
            compiled[name] = dataclasses.replace(info,
                                                 prebuilt_failure=compiled[name].failure)
    seconds = time.monotonic() - started
    log.info("module step took %.0f s (its own limit, --compile-timeout)", seconds)
    for name, info in compiled.items():
        if not info.ok:
            log.error("variant %s: JIT build failed: %s\n%s", name, info.failure,
                      "\n".join(info.tail))
    return Prepared(run_dir=run_dir, variants=installed, compiled=compiled,
                    module_seconds=seconds)


def run_environment(compiled: dict[str, ModuleBuild], primary: str,
                    wheel_dirs: Mapping[str, Path]) -> Environment:
    env: Environment = compiled[primary].env.copy() if primary in compiled else {}
    env.update(_nvidia_smi())
    nvcc = locate_nvcc()
    env["nvcc"] = nvcc.version_text if nvcc else None
    # the manifest published beside its wheel, if any
    if (path := records.beside(wheel_dirs.get(primary), manifest_file.FILE)) is not None:
        try:
            env["wheels_manifest"] = manifest_file.read(path).to_json()
        except ConfigError as exc:
            env["wheels_manifest"] = {"error": str(exc)}
    return env


def run_out(opts: RunOptions, env: Environment) -> tuple[Path, portable.Roles]:
    """The run's output folder, and this machine's paths by role for reports that travel."""
    gpus = env.get("gpus") or ["unknown"]
    out = opts.out or Path("gpu-runs") / report.gpu_slug(gpus[0], int(env.get("gpu_count") or 0))
    return out, portable.machine_roles(Path.cwd(), {"gpu-work": opts.work_dir, "out": out})


def collect_logs(run_dir: Path, dest: Path, roles: portable.Roles) -> None:
    """One log file per variant and world size: every attempt's rank logs, concatenated."""
    dest.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[Path]] = {}
    for path in sorted(run_dir.glob("*.log")):
        stem = path.stem
        group = stem.split("-a")[0] if "-ws" in stem else stem.split("-rank")[0]
        groups.setdefault(group, []).append(path)
    for group, paths in groups.items():
        with (dest / f"{group}.log").open("w") as out:
            for path in paths:
                out.write(f"===== {path.name} =====\n")
                out.write(portable.portable_text(path.read_text(errors="replace"), roles))
                out.write("\n")
