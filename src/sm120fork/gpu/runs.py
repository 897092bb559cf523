"""The GPU verbs' work: install the variants, build their modules, run, write the reports.

``python -m sm120fork.gpu`` and ``sm120fork gpu`` parse their arguments into the options
here and print what these functions return; nothing here prints or exits.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sm120fork import manifest as manifest_file
from sm120fork import record
from sm120fork.cuda.toolkit import locate_nvcc
from sm120fork.errors import CommandError, ConfigError, UsageError, VerifyError
from sm120fork.gpu import launcher, report
from sm120fork.gpu import methods as methods_mod
from sm120fork.gpu import policy as policy_mod
from sm120fork.gpu.core import cases as cases_mod
from sm120fork.gpu.core import documents, records, variants
from sm120fork.gpu.core.records import now
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
        "kind": "gpu-test", "created": now(), "command": opts.command,
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
            "kind": "gpu-bench", "created": now(), "command": opts.command,
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
    made = {"created": now(), "gpu": (env.get("gpus") or ["?"])[0], "gpu_count": gpu_count,
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
