"""The GPU verbs' work: install the variants, build their modules, run, write the reports.

``python -m sm120fork.gpu`` and ``sm120fork gpu`` parse their arguments into the options
here and print what these functions return; nothing here prints or exits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sm120fork import manifest as manifest_file
from sm120fork import record
from sm120fork.cuda.toolkit import locate_nvcc
from sm120fork.errors import CommandError, ConfigError, UsageError, VerifyError
from sm120fork.gpu import launcher, report, sglang_layer
from sm120fork.gpu import methods as methods_mod
from sm120fork.gpu import policy as policy_mod
from sm120fork.gpu.core import cases as cases_mod
from sm120fork.gpu.core import documents, records, variants
from sm120fork.gpu.core.documents import LayerMachine, MadeFrom, Provenance
from sm120fork.gpu.core.safety import check_backend
from sm120fork.gpu.core.variants import ModuleBuild
from sm120fork.util import portable, proc

log = logging.getLogger("sm120fork")

DEFAULT_WORK_DIR = Path(os.environ.get("SM120FORK_GPU_WORK", "/tmp/sm120fork-gpu"))


_Opts = TypeVar("_Opts", bound="RunOptions")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What ``test`` and ``bench`` share (the parser's common options)."""

    command: str  # recorded in the reports
    wheel_dirs: tuple[str, ...] = ()
    prebuilt: tuple[str, ...] = ()
    also_build: tuple[str, ...] = ()
    quick: bool = False
    out: Path | None = None
    work_dir: Path = DEFAULT_WORK_DIR
    backend: str = "trtllm"
    allow_multicast: bool = False
    startup_timeout: float = 300.0
    case_timeout: float = 90.0
    compile_timeout: float = 1200.0
    #: Seconds after the module build past which no case starts (``tune`` passes what it
    #: has left); cases left out are not run, and the run is partial.
    time_budget: float | None = None
    not_run: tuple[str, ...] = ()
    #: A partial run (time budget) is no error (``tune`` keeps the sizes that finished).
    allow_partial: bool = False
    stack: str | None = None  # the stack's built wheels (and upstream's, for test)
    #: The command the record names (as typed, without this machine's paths).
    record_command: str | None = None
    #: The record's ``tested`` block (``--stack``); else tested.json beside the wheel.
    tested: record.Tested | None = None

    def with_stack(self: _Opts, *, baseline: bool) -> _Opts:
        """``--stack``: the variants from the stack's build and pin (no --wheel-dir)."""
        if self.stack is None:
            return self
        if self.wheel_dirs:
            raise UsageError("--stack and --wheel-dir exclude each other",
                              fix="pass one of them")
        from sm120fork.gpu.core import stack_wheels

        found = stack_wheels.resolve(self.stack, baseline=baseline)
        notes = (*self.not_run, found.note) if found.note else self.not_run
        return dataclasses.replace(self, wheel_dirs=found.specs, not_run=notes,
                                   tested=found.tested)

    def timeouts(self) -> launcher.Timeouts:
        """The cases' limits; the budget counts from now (after the module build)."""
        deadline = None if self.time_budget is None else time.monotonic() + self.time_budget
        return launcher.Timeouts(startup=self.startup_timeout, idle=self.case_timeout,
                                 deadline=deadline)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestOptions(RunOptions):
    world_sizes: tuple[int, ...] | None = None  # default_test_world_sizes(GPU count)
    apis: tuple[str, ...] | None = None
    patterns: tuple[str, ...] | None = None
    tokens: tuple[int, ...] | None = None
    hidden: tuple[int, ...] | None = None
    max_cases: int | None = None
    primary: str | None = None
    title: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchOptions(RunOptions):
    world_sizes: tuple[int, ...] | None = None  # default: the GPU count, at least 2
    methods: tuple[str, ...] | None = None  # default: every registered method
    tokens: tuple[int, ...] | None = None
    hidden: tuple[int, ...] | None = None


def _never_ran(rec: Mapping[str, object]) -> bool:
    """Left out by a time budget, or its variant's module did not build."""
    return bool(rec.get("not_run")) or rec.get("failure") == "build"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tally:
    """One variant's records counted: what ran, what was skipped, what never ran (a budget
    used up, a module that did not build): those are neither passing nor failing."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> Tally:
        ran = [r for r in records if not _never_ran(r)]

        def count(status: str) -> int:
            return sum(1 for r in ran if r["status"] == status)
        return cls(passed=count("pass"), failed=count("fail"), skipped=count("skip"),
                   not_run=len(records) - len(ran))

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped + self.not_run

    @property
    def ran(self) -> int:
        return self.passed + self.failed


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestRun:
    """What a ``test`` run wrote and found."""

    paths: list[Path]
    logs: Path
    primary: str
    tallies: dict[str, Tally]
    failed: list[str]
    summary: dict[str, int]
    module_seconds: float
    time_budget: float | None = None
    allow_partial: bool = False

    @property
    def total(self) -> int:
        return self.tallies[self.primary].total

    @property
    def not_run(self) -> int:
        return sum(t.not_run for t in self.tallies.values())

    def headline(self) -> list[str]:
        """A line per variant, then the module build and whether the run is partial."""
        lines = []
        for name, t in self.tallies.items():
            line = (f"{name}: {t.failed} failing, {t.passed} passing, {t.skipped} skipped"
                    f" of {t.total}")
            if t.not_run:
                line += f"; {t.not_run} NEVER RAN (module build failed or time budget)"
            if not t.ran:
                line += "; NOTHING RAN"
            lines.append(line)
        budget = ("" if self.time_budget is None else
                  f"; cases' time budget {self.time_budget:.0f} s, counted after it")
        lines.append(f"module build {self.module_seconds:.0f} s{budget}; A/B: {self.summary}")
        if self.not_run:
            lines.append("UNFINISHED: not every planned case ran"
                         + (" (accepted)" if self.allow_partial else ""))
        return lines

    def error(self) -> VerifyError | None:
        if self.failed:
            return VerifyError(f"{len(self.failed)} cases fail with {self.primary}",
                               fix=f"see {self.paths[1]}")
        built = sum(1 for t in self.tallies.values() if t.not_run and not self.time_budget)
        if built:
            return VerifyError(f"unfinished: {self.not_run} planned case runs never ran (a "
                               "module did not build)", fix=f"see {self.paths[1]}")
        nothing = [n for n, t in self.tallies.items() if not t.ran]
        if nothing:
            return VerifyError(f"no case ran for {', '.join(nothing)}: every case was skipped "
                               "or not run", fix=f"see {self.paths[1]}")
        if self.not_run and not self.allow_partial:
            return VerifyError(
                f"unfinished: {self.not_run} planned cases did not run: the time budget "
                "was used up")
        return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRun:
    paths: list[Path]
    failure: str | None
    kind: str | None = None
    timed: int = 0
    module_seconds: float = 0.0
    allow_partial: bool = False
    policy: list[str] = dataclasses.field(default_factory=list)

    def headline(self) -> list[str]:
        return [f"{self.timed} bench points timed; module build {self.module_seconds:.0f} s"
                + ("; PARTIAL RUN: the time budget was used up" if self.kind == "budget"
                   else ""), *(f"policy: {line}" for line in self.policy)]

    def error(self) -> VerifyError | None:
        if self.kind == "budget" and self.timed and self.allow_partial:
            return None
        if self.failure is not None:
            return VerifyError(f"bench ranks failed: {self.failure}")
        if not self.timed:
            return VerifyError("the bench timed nothing (every method was not runnable or "
                               "failed its check)", fix="see the bench report")
        return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def _run_dir(work: Path, what: str) -> Path:
    path = work / "runs" / f"{what}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _nvidia_smi() -> dict[str, Any]:
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


def _manifest(wheel_dirs: Sequence[str], primary: str) -> dict[str, Any] | None:
    """The toolkit manifest published beside the primary variant's wheel (if any)."""
    for spec in wheel_dirs:
        name, _, where = spec.partition("=")
        if name != primary:
            continue
        folder = Path(where) if Path(where).is_dir() else Path(where).parent
        path = folder / manifest_file.FILE
        if path.is_file():
            try:  # read through the typed reader: the run records what it can check
                return manifest_file.read(path).to_json()
            except ConfigError as exc:
                return {"error": str(exc)}
    return None


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
    specs = variants.parse_variant_specs(opts.wheel_dirs)
    work = opts.work_dir
    run_dir = _run_dir(work, what)
    prebuilt = variants.parse_variant_specs(opts.prebuilt)
    unknown = sorted(set(prebuilt) - set(specs))
    if unknown:
        raise UsageError(f"--prebuilt for unknown variants {unknown}", where="--prebuilt")
    installed = [variants.install_variant(name, path, work, prebuilt.get(name))
                 for name, path in (specs.items() if specs else [("installed", None)])]
    modules = [*modules, *(m for m in opts.also_build if m not in modules)]
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


def _environment(compiled: dict[str, ModuleBuild], primary: str,
                 wheel_dirs: Sequence[str]) -> dict[str, Any]:
    env: dict[str, Any] = dict(compiled[primary].env) if primary in compiled else {}
    env.update(_nvidia_smi())
    nvcc = locate_nvcc()
    env["nvcc"] = nvcc.version_text if nvcc else None
    manifest = _manifest(wheel_dirs, primary)
    if manifest is not None:
        env["wheels_manifest"] = manifest
    return env


def _out_dir(opts: RunOptions, env: dict[str, Any]) -> Path:
    if opts.out:
        return opts.out
    gpus = env.get("gpus") or ["unknown"]
    return Path("gpu-runs") / report.gpu_slug(gpus[0], int(env.get("gpu_count") or 0))


def _roles(opts: RunOptions, out: Path) -> portable.Roles:
    """This machine's paths by role, for reports that travel (issue 8: no machine path)."""
    return portable.machine_roles(Path.cwd(), {"gpu-work": opts.work_dir, "out": out})


def _collect_logs(run_dir: Path, dest: Path, roles: portable.Roles) -> None:
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


def default_test_world_sizes(gpu_count: int) -> tuple[int, ...]:
    """The A/B's world sizes when none are named: 2, 4 and 8 as far as the box has GPUs, and 2
    (ranks sharing the GPU) on a one-GPU box, where more ranks per GPU only cost time."""
    return tuple(ws for ws in (2, 4, 8) if ws <= max(2, gpu_count))


def run_test(opts: TestOptions) -> TestRun:
    """The correctness matrix over every variant (A/B), report under ``opts.out``."""
    opts = opts.with_stack(baseline=True)
    prepared = prepare(opts, "test", ["comm"])
    run_dir, installed, compiled = prepared.run_dir, prepared.variants, prepared.compiled
    names = [v.name for v in installed]
    primary = opts.primary or ("patched" if "patched" in names else names[0])
    if primary not in names:
        raise UsageError(f"--primary {primary} is not a variant", fix=f"one of {names}")
    others = [n for n in names if n != primary]
    baseline = "unpatched" if "unpatched" in others else (others[0] if others else None)
    env = _environment(compiled, primary, opts.wheel_dirs)
    gpu_count = int(env.get("gpu_count") or 1)
    world_sizes = list(opts.world_sizes or default_test_world_sizes(gpu_count))
    matrix = (cases_mod.quick_matrix if opts.quick else cases_mod.full_matrix)(world_sizes)
    matrix = cases_mod.select(matrix, apis=opts.apis, patterns=opts.patterns,
                              tokens=opts.tokens, hidden=opts.hidden,
                              max_cases=opts.max_cases)
    timeouts = opts.timeouts()
    results: dict[str, list[dict[str, Any]]] = {v.name: [] for v in installed}
    # Variants alternate per batch, so a time budget leaves a complete A/B of what ran.
    for batch in cases_mod.phases(matrix):
        ws = batch[0].world_size
        for variant in installed:
            info = compiled[variant.name]
            if not info.ok:
                results[variant.name] += [
                    {"key": c.key, "case": c.to_dict(), "status": "fail", "failure": "build",
                     "reason": f"JIT build failed: {info.failure}", "log_tail": list(info.tail)}
                    for c in batch]
                continue
            log.info("variant %s, world size %d: %d cases (%s)", variant.name, ws, len(batch),
                     batch[0].api)
            started = time.monotonic()
            results[variant.name] += launcher.run_cases(
                batch, variant, run_dir, backend=opts.backend,
                allow_multicast=opts.allow_multicast, timeouts=timeouts, progress=log.info)
            log.info("variant %s, world size %d took %.0f s", variant.name, ws,
                     time.monotonic() - started)
    shared = any(ws > gpu_count for ws in world_sizes)
    from sm120fork.gpu.core.reference import tolerance_table

    doc = {
        "kind": "gpu-test", "created": _now(), "command": opts.command,
        "title": (f"{opts.title}, " if opts.title else "")
        + f"{(env.get('gpus') or ['?'])[0]} x{env.get('gpu_count', '?')}",
        "environment": env, "shared": shared, "quick": opts.quick,
        "world_sizes": world_sizes, "primary": primary, "baseline": baseline,
        "variants": {v.name: {**v.describe(), "flashinfer": compiled[v.name].env.get(
            "flashinfer"), "compiled": compiled[v.name].ok,
            "compile_failure": compiled[v.name].failure,
            "prebuilt_failure": compiled[v.name].prebuilt_failure}
            for v in installed},
        "tolerances": tolerance_table(), "results": results, "not_run": list(opts.not_run),
        "module_seconds": round(prepared.module_seconds, 1), "time_budget": opts.time_budget,
        "finished": not any(_never_ran(r) for recs in results.values() for r in recs),
    }
    out = _out_dir(opts, env)
    roles = _roles(opts, out)
    paths = report.write_test_report(doc, out, roles)
    try:
        rec = records.test_record(
            documents.parse_ab({**doc, "command": opts.record_command or opts.command},
                               "test-ab.json"),
            opts.tested or records.read_tested(opts.wheel_dirs, primary))
    except ConfigError as exc:  # the run stands; its record would break the format
        log.error("no record: %s", exc)
        rec = None
    if rec is not None:
        paths.append(records.write(rec, out))
    else:
        log.warning("no record: the tested wheel is no stack's build (no manifest.json "
                    "beside it)")
    _collect_logs(run_dir, out / "logs", roles)
    failed = [r["key"] for r in results[primary] if r["status"] == "fail" and not _never_ran(r)]
    order, table = report.ab_rows(documents.parse_ab(doc, "test-ab.json"))
    classes = ["not run" if any(_never_ran(r) for r in table[k].values())
               else report.classify({v: r["status"] for v, r in table[k].items()}, primary,
                                    baseline) for k in order]
    summary = {c: classes.count(c) for c in sorted(set(classes))}
    return TestRun(paths=paths, logs=out / "logs", primary=primary,
                   tallies={name: Tally.of(recs) for name, recs in results.items()},
                   failed=failed, summary=summary, module_seconds=prepared.module_seconds,
                   time_budget=opts.time_budget, allow_partial=opts.allow_partial)


def run_bench(opts: BenchOptions) -> BenchRun:
    """Every method at every point, per world size, one report each; and the policy.

    Per world size, the methods run in one group of ranks, except those whose
    environment differs (a tuned NCCL row: NCCL reads its settings once per process),
    which get a group of their own.  Each method is checked against the fp32 reference
    before it is timed (:mod:`.methods`).
    """
    opts = opts.with_stack(baseline=False)
    if len(opts.wheel_dirs) > 1:
        raise UsageError("bench measures one variant", where="--wheel-dir")
    chosen = methods_mod.select(opts.methods)
    unknown = sorted(set(opts.methods or ()) - set(methods_mod.METHODS))
    if unknown:
        raise UsageError(f"unknown methods {unknown}", where="--method",
                          fix=f"one of {list(methods_mod.METHODS)}")
    prepared = prepare(opts, "bench", ["comm", "norm", *methods_mod.modules(chosen)])
    run_dir, installed, compiled = prepared.run_dir, prepared.variants, prepared.compiled
    variant = installed[0]
    env = _environment(compiled, variant.name, opts.wheel_dirs)
    if not compiled[variant.name].ok:
        raise VerifyError(f"JIT build failed for {variant.name}",
                          detail="\n".join(compiled[variant.name].tail))
    module_failures = dict(compiled[variant.name].module_failures)
    gpu_count = int(env.get("gpu_count") or 1)
    worlds = list(opts.world_sizes or (max(2, gpu_count),))
    timeouts = opts.timeouts()
    out = _out_dir(opts, env)
    roles = _roles(opts, out)
    paths: list[Path] = []
    by_world: dict[int, list[dict[str, Any]]] = {}
    failures: list[str] = []
    partial = False
    for world in worlds:
        plan = cases_mod.bench_plan(world, quick=opts.quick, tokens=opts.tokens,
                                    hidden=opts.hidden)
        shared = world > gpu_count
        records: list[dict[str, Any]] = []
        rank_env: dict[str, Any] = {}
        outcomes = []
        for index, (group_env, names) in enumerate(methods_mod.group_envs(chosen).items()):
            if group_env and shared:
                records += [{"kind": "method", "method": name,
                             "status": methods_mod.NOT_RUNNABLE,
                             "reason": "ranks share a GPU: NCCL refuses two ranks on one "
                             "GPU, so this row cannot run on this machine"}
                            for name in names]
                continue
            pending, attempt = list(names), 0
            while pending:
                group_plan = dataclasses.replace(plan, floors=index == 0 and attempt == 0)
                started = time.monotonic()
                got, got_env, outcome = launcher.run_bench(
                    group_plan.to_dict(), variant, run_dir, methods=pending,
                    tag=f"bench-ws{world}-g{index}-a{attempt}", extra_env=dict(group_env),
                    module_failures=module_failures, backend=opts.backend,
                    allow_multicast=opts.allow_multicast, timeouts=timeouts)
                log.info("bench, world size %d, %s: %.0f s", world, pending,
                         time.monotonic() - started)
                records += got
                rank_env = rank_env or got_env
                outcomes.append(outcome)
                if outcome.ok:
                    break
                failures.append(f"world size {world}, {pending}: {outcome.failure}")
                partial = partial or outcome.kind == "budget"
                if outcome.kind == "budget":
                    break
                culprit, pending = resume_after(pending, got)
                if culprit is not None:
                    records.append({"kind": "method", "method": culprit,
                                    "status": methods_mod.ERROR,
                                    "reason": f"the ranks died while it ran "
                                    f"({outcome.kind}: {outcome.failure}); the methods "
                                    "after it ran in a new group"})
                attempt += 1
        finished = all(o.ok for o in outcomes)
        doc = {
            "kind": "gpu-bench", "created": _now(), "command": opts.command,
            "title": f"{(env.get('gpus') or ['?'])[0]} x{gpu_count}, world size {world}"
            + (f" ({report.SHARED_LABEL})" if shared else ""),
            "environment": {**env, **{k: v for k, v in rank_env.items() if k not in env}},
            "shared": shared, "label": report.SHARED_LABEL if shared else None,
            "world_size": world, "dtype": plan.dtype, "plan": plan.to_dict(),
            "methods": chosen, "module_failures": module_failures,
            "variant": variant.name, **variant.describe(), "records": records,
            "outcome": {"ok": finished, "failure": "; ".join(
                o.failure or "" for o in outcomes if not o.ok) or None,
                "kinds": [o.kind for o in outcomes],
                "log_tail": None if finished else [o.tails for o in outcomes]},
            "not_run": list(opts.not_run),
            "module_seconds": round(prepared.module_seconds, 1),
            "time_budget": opts.time_budget, "finished": finished,
        }
        dest = out if len(worlds) == 1 else out / f"ws{world}"
        paths += report.write_bench_report(doc, dest, roles)
        by_world[world] = records
    shared_any = any(w > gpu_count for w in worlds)
    manifest = env.get("wheels_manifest") or {}
    made = {"created": _now(), "gpu": (env.get("gpus") or ["?"])[0], "gpu_count": gpu_count,
            "shared_gpu": shared_any, "stack": manifest.get("stack"),
            "flashinfer": env.get("flashinfer"), "wheel_sha256": variant.sha256,
            "dtype": "bf16", "hidden": sorted({int(r["hidden"]) for recs in by_world.values()
                                                for r in recs if r.get("kind") == "point"}),
            "note": (report.SHARED_LABEL + ": made on a shared GPU, not for use")
            if shared_any else ("partial run: not for use" if failures else None)}
    policy = policy_mod.derive(by_world, made=made,
                               for_use=not shared_any and not failures)
    paths.append(policy_mod.write(policy, out))
    _collect_logs(run_dir, out / "logs", roles)
    timed = sum(1 for recs in by_world.values() for r in recs
                if r.get("kind") == "point" and r.get("status") == methods_mod.TIMED)
    return BenchRun(paths=paths, failure="; ".join(failures) or None,
                    kind="budget" if partial else None, timed=timed,
                    module_seconds=prepared.module_seconds,
                    allow_partial=opts.allow_partial,
                    policy=policy_mod.describe(policy))


def resume_after(methods: Sequence[str], records: Sequence[dict[str, Any]],
                 ) -> tuple[str | None, list[str]]:
    """The method that was running when a bench group died, and the ones still to run.

    Nothing started (the ranks died before any method): no culprit, nothing resumed.
    """
    started = [r["method"] for r in records
               if r.get("kind") == "method" and r.get("status") == methods_mod.STARTING]
    if not started:
        return None, []
    culprit = started[-1]
    return culprit, list(methods[list(methods).index(culprit) + 1:])


def rerender(test: Path | None, bench: Path | None, out: Path) -> list[Path]:
    """Re-render reports from their JSON."""
    written: list[Path] = []
    if test:
        written += report.write_test_report(documents.read(test), out, where=str(test))
    if bench:
        written += report.write_bench_report(documents.read(bench), out, where=str(bench))
    if not written:
        raise UsageError("nothing to render", fix="pass --test and/or --bench")
    return written


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerRoute:
    """A second install route of the same stack in one ``sglang-layer`` run: stock SGLang
    (``sglang_path``) with the stack's plugin beside it (``site``), ``load_plugins()`` in
    every rank; its cases are recorded as variant ``variant``."""

    variant: str
    sglang_path: Path
    site: tuple[Path, ...] = ()
    #: what the record lists of it: ``made_from`` rows as :class:`LayerOptions` ``made``
    made_from: tuple[MadeFrom, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerOptions:
    """``sglang-layer``: SGLang's fused-norm layer path in fresh rank groups."""

    command: str
    sglang_path: Path
    out: Path
    #: The tree's upstream layout (:mod:`sm120fork.layouts`).
    layout: str
    site: tuple[Path, ...] = ()
    cases: tuple[str, ...] | None = None
    device: str = "cuda"
    world_size: int = 2
    tokens: tuple[int, ...] | None = None
    timeout: float = 120.0
    first_timeout: float | None = None
    start_timeout: float = 300.0
    gates_in_memory: bool = False
    load_plugins: bool = False
    title: str = "SGLang fused-norm layer path"
    notes: tuple[str, ...] = ()
    #: ``stack`` and ``made_from`` (each tested wheel's sha256) of the stack's build.
    made: Provenance | None = None
    #: The record's ``tested`` block, what the preflight found, the command it names.
    tested: record.Tested | None = None
    machine: LayerMachine = dataclasses.field(default_factory=LayerMachine)
    record_command: str | None = None
    #: The tree's fused-call agreement timeout (None: its own) and the ranks' gloo groups'
    #: timeout (None: twice the case's), seconds (sglang_layer.run_case).
    agreement_timeout: float | None = None
    group_timeout: float | None = None
    #: the route of ``sglang_path``'s cases in the record ("patched": the stack's wheel)
    variant: str = "patched"
    #: further routes whose cases run in the same run (the plugin on stock SGLang)
    routes: tuple[LayerRoute, ...] = ()
    #: seconds from the start after which no further case starts (None: no limit); the
    #: cases left are listed as not run and the record stays unfinished
    time_budget: float | None = None
    #: cases run at once, each in its own group of ranks (the GPU is shared anyway)
    jobs: int = 1
    #: build FlashInfer's comm modules once, before the cases (on a GPU)
    prebuild: bool = False


#: What every GPU layer run's record says of how the ranks ran (the harness's own terms).
LAYER_NOTES = (
    "ranks are processes sharing the GPUs: correctness only, timings mean nothing",
    "SGLang's capability query answers 12.0 to callers in sglang.* only (its SM12x gates "
    "and policy run); FlashInfer builds and runs for the real GPU",
    "TP group: gloo over the rank processes (NCCL refuses two ranks on one GPU) as the "
    "stand-in for NCCL; sgl_kernel is an import stub, so the unfused norm is SGLang's "
    "forward_native",
    "policy-graph: a step whose route is SGLang's NCCL dispatch is checked eagerly (its gloo "
    "stand-in cannot be recorded into a CUDA graph); the fused and pcie_ipc steps are "
    "captured and replayed on new inputs",
)
#: What a case is expected to take at most when the time budget decides whether it
#: starts (ranks import SGLang, then run a few collectives: about 30 s on the H200 box).
CASE_ESTIMATE_S = 60.0
#: FlashInfer modules the layer path JIT-builds on first use: our fused path's comm
#: module and SGLang's pcie_ipc all-reduce's (the policy cases); built once, together.
PREBUILD = {
    "trtllm comm": "from flashinfer.comm.trtllm_ar import get_trtllm_comm_module as g; g()",
    "pcie_ipc": "from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module as g; g()",
}


def planned_cases(opts: LayerOptions) -> list[tuple[str, str]]:
    """(variant, case) of every case the run plans, the routes interleaved case by case
    (a run cut short by its time budget has run the same cases on every route)."""
    if opts.cases:
        chosen = list(opts.cases)
    elif opts.device == "cuda":
        chosen = list(sglang_layer.GPU_PLAN.get(opts.layout, sglang_layer.GPU_CASES))
    else:
        chosen = [c for c in sglang_layer.CPU_CASES if opts.layout == "layer_boundary"
                  or c not in sglang_layer.POLICY_CASES]
    return [(variant, case) for case in chosen
            for variant in [opts.variant, *(r.variant for r in opts.routes)]]


def _prebuild(opts: LayerOptions) -> None:
    """FlashInfer's modules built once (in parallel), before any rank needs them."""
    from sm120fork.gpu.core.safety import rank_environment

    env = rank_environment(dict(os.environ))  # multicast off, as in every rank
    env["PYTHONPATH"] = os.pathsep.join([*map(str, opts.site), str(opts.sglang_path)])
    started = time.monotonic()
    log.info("building FlashInfer's %s modules once (JIT; a few minutes the first time)",
             " and ".join(PREBUILD))
    with proc.ProcessGroup() as group:
        running = {name: group.start([sys.executable, "-c", code], env=env)
                   for name, code in PREBUILD.items()}
        for name, child in running.items():
            code = child.wait()
            log.info("module %s: %s after %.0f s", name, "built" if code == 0 else
                     f"FAILED (exit {code}; its cases will say why)",
                     time.monotonic() - started)


def run_sglang_layer(opts: LayerOptions) -> list[sglang_layer.CaseOutcome]:
    """Every case in fresh rank groups; report.md + report.json under ``opts.out``."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    planned = planned_cases(opts)
    if opts.prebuild and opts.device == "cuda":
        _prebuild(opts)
    routes = {opts.variant: LayerRoute(variant=opts.variant, sglang_path=opts.sglang_path,
                                       site=opts.site),
              **{r.variant: r for r in opts.routes}}
    done: dict[int, sglang_layer.CaseOutcome] = {}
    not_run: list[str] = []

    def one(index: int) -> None:
        variant, case = planned[index]
        if opts.time_budget is not None and (
                time.monotonic() - started + CASE_ESTIMATE_S > opts.time_budget):
            not_run.append(f"{variant} {case}: not started, the time budget "
                           f"({opts.time_budget:.0f} s) ran out")
            log.info("[%d/%d] %s %s: not started (time budget)", index + 1, len(planned),
                     variant, case)
            return
        route = routes[variant]
        timeout = opts.first_timeout if index == 0 and opts.first_timeout else opts.timeout
        plugin = route is not routes[opts.variant]
        log.info("[%d/%d] %s %s: starting at %.0f s", index + 1, len(planned), variant,
                 case, time.monotonic() - started)
        outcome = sglang_layer.run_case(
            case, sglang_path=route.sglang_path, device=opts.device,
            world_size=opts.world_size, tokens=list(opts.tokens) if opts.tokens else None,
            timeout=timeout, start_timeout=opts.start_timeout, extra_path=list(route.site),
            gates_in_memory=opts.gates_in_memory and not plugin, layout=opts.layout,
            load_plugins=opts.load_plugins or plugin,
            agreement_timeout_s=opts.agreement_timeout,
            collective_timeout_s=opts.group_timeout, variant=variant)
        log.info("[%d/%d] %s %s: %s in %.0f s %s", index + 1, len(planned), variant, case,
                 "PASS" if outcome.passed else "FAIL", outcome.seconds,
                 "; ".join(outcome.problems))
        done[index] = outcome
        _publish(opts, [done[i] for i in sorted(done)], planned, not_run,
                 finished=len(done) == len(planned))

    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        list(pool.map(one, range(len(planned))))
    outcomes = [done[i] for i in sorted(done)]
    _publish(opts, outcomes, planned, not_run, finished=len(done) == len(planned))
    if len(done) < len(planned):
        log.info("cut short: %d of %d planned cases ran (%s); not run: %s", len(done),
                 len(planned), ", ".join(f"{o.variant} {o.case}" for o in outcomes) or "none",
                 "; ".join(not_run))
    return outcomes


def _publish(opts: LayerOptions, outcomes: Sequence[sglang_layer.CaseOutcome],
             planned: Sequence[tuple[str, str]], not_run: Sequence[str], *,
             finished: bool) -> None:
    """report.md, report.json and the record, as far as the run got."""
    _write_sglang_layer_report(opts, outcomes, done=finished,
                               planned=[c if v == opts.variant else f"{v} {c}"
                                        for v, c in planned],
                               made=opts.made)
    made_from = [*(opts.made["made_from"] if opts.made else ()),
                 *(m for r in opts.routes for m in r.made_from)]
    try:
        rec = records.layer_record(
            made={"stack": opts.made["stack"] if opts.made else None, "made_from": made_from},
            tested=opts.tested,
            command=opts.record_command or opts.command, created=_now(),
            machine=opts.machine, planned=planned, outcomes=outcomes,
            notes=(*opts.notes, *(LAYER_NOTES if opts.device == "cuda" else ())),
            not_run=tuple(not_run))
    except ConfigError as exc:  # the run goes on; its record would break the format
        log.error("no record: %s", exc)
        rec = None
    if rec is not None:
        records.write(rec, opts.out)


def _write_sglang_layer_report(opts: LayerOptions,
                               outcomes: Sequence[sglang_layer.CaseOutcome], *,
                               done: bool, planned: Sequence[str] = (),
                               made: Provenance | None = None) -> None:
    """Rewritten after every case, so a run cut short still leaves what it finished."""
    opts.out.mkdir(parents=True, exist_ok=True)
    notes = [f"command: `{opts.command}`",
             f"{'finished' if done else 'in progress'} {_now()}", *opts.notes]
    (opts.out / "report.md").write_text(
        sglang_layer.render(outcomes, title=opts.title, notes=notes), encoding="utf-8")
    (opts.out / "report.json").write_text(
        json.dumps({"kind": "sglang-layer", "notes": notes, "planned": list(planned),
                    "finished": done, "layout": opts.layout, **(made or {}),
                    "cases": sglang_layer.to_json(outcomes)}, indent=1),
        encoding="utf-8")


def command_line(argv: Sequence[str]) -> str:
    """How a report names the command that made it."""
    return shlex.join(["python", "-m", "sm120fork.gpu", *argv])
