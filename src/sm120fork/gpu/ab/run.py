"""``test``: the correctness matrix over every variant (A/B), its report and its record.
The cases run in batches of rank processes; when a group ends early, the case in progress
fails with every rank's last lines and the rest continue in a new group."""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120fork import __version__, record
from sm120fork.errors import ConfigError, UsageError, VerifyError
from sm120fork.gpu.ab.results import AbRun, AbTable, CaseResult, Check, write_test_report
from sm120fork.gpu.core import cases as cases_mod
from sm120fork.gpu.core import records, runs
from sm120fork.gpu.core.cases import CUSTOM_API, Case, RankSpec
from sm120fork.gpu.core.records import now
from sm120fork.gpu.core.report import built_manifest
from sm120fork.gpu.core.runs import RunOptions
from sm120fork.gpu.core.variants import Timeouts, Variant, run_ranks
from sm120fork.util import typed, wire
from sm120fork.util.proc import GroupOutcome
from sm120fork.util.typed import json_file

log = logging.getLogger("sm120fork")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestOptions(RunOptions):
    apis: tuple[str, ...] | None = None
    patterns: tuple[str, ...] | None = None
    max_cases: int | None = None
    primary: str | None = None
    title: str | None = None


@dataclasses.dataclass(frozen=True)
class Tally:
    """One variant's records counted; what never ran is neither passing nor failing."""

    passed: int
    failed: int
    skipped: int
    not_run: int

    @classmethod
    def of(cls, records: Sequence[CaseResult]) -> Tally:
        ran = Counter(r.status for r in records if not r.never_ran)
        return cls(ran["pass"], ran["fail"], ran["skip"], sum(r.never_ran for r in records))

    @property
    def ran(self) -> int:
        return self.passed + self.failed


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestRun:
    paths: list[Path]
    logs: Path
    doc: AbRun
    module_seconds: float
    allow_partial: bool = False

    @property
    def tallies(self) -> dict[str, Tally]:
        return {name: Tally.of(recs) for name, recs in self.doc.results.items()}

    @property
    def not_run(self) -> int:
        return sum(t.not_run for t in self.tallies.values())

    def headline(self) -> list[str]:
        lines = [f"{name}: {t.failed} failing, {t.passed} passing, {t.skipped} skipped of "
                 f"{len(self.doc.results[name])}"
                 + (f"; {t.not_run} NEVER RAN (module build failed or time budget)"
                    if t.not_run else "") + ("" if t.ran else "; NOTHING RAN")
                 for name, t in self.tallies.items()]
        budget = ("" if self.doc.time_budget is None else
                  f"; cases' time budget {self.doc.time_budget:.0f} s, counted after it")
        lines.append(f"module build {self.module_seconds:.0f} s{budget}; "
                     f"A/B: {AbTable(self.doc).counts()}")
        if self.not_run:
            lines.append("UNFINISHED: not every planned case ran"
                         + (" (accepted)" if self.allow_partial else ""))
        return lines

    def error(self) -> VerifyError | None:
        nothing = [n for n, t in self.tallies.items() if not t.ran]
        failed = self.tallies[self.doc.primary].failed
        for wrong, message in (
                (failed, f"{failed} cases fail with {self.doc.primary}"),
                (self.not_run and not self.doc.time_budget, f"unfinished: {self.not_run} planned "
                 "case runs never ran (a module did not build)"),
                (nothing, f"no case ran for {', '.join(nothing)}: every case was skipped or "
                 "not run")):
            if wrong:
                return VerifyError(message, fix=f"see {self.paths[1]}")
        if self.not_run and not self.allow_partial:
            return VerifyError(
                f"unfinished: {self.not_run} planned cases did not run: the time budget "
                "was used up")
        return None


def _merge(case: Case, records: dict[int, CaseResult]) -> CaseResult:
    """One result per case from every rank's (a case passes only if all ranks do)."""
    if {r.status for r in records.values()} == {"skip"}:
        return CaseResult(key=case.key, case=case, status="skip",
                          reason=next(iter(records.values())).reason)
    checks: dict[tuple[str, str], Check] = {}  # each output and stage's worst rank
    for check in (c for rec in records.values() for c in rec.checks):
        k = (check.output, check.stage)
        checks[k] = max(checks.get(k, check), check, key=lambda c: (not c.ok, c.rel_l2 or 0))
    failing = sorted(r for r, rec in records.items() if rec.status != "pass")
    if not failing:
        return CaseResult(key=case.key, case=case, status="pass", checks=tuple(checks.values()))
    first = records[failing[0]]
    reason = first.reason or "; ".join(f"{c.output} ({c.stage}): {c.reason}"
                                       for c in checks.values() if not c.ok)[:1500]
    return CaseResult.failed(case, first.failure or "wrong result", reason,
                             checks=tuple(checks.values()), failing_ranks=tuple(failing),
                             traceback=first.traceback)


@dataclasses.dataclass
class _Reports:
    """What each rank of one group said: the cases it started, each case's results."""

    started: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    results: dict[str, dict[int, CaseResult]] = dataclasses.field(default_factory=dict)

    def on_message(self, rank: int, message: wire.Message) -> None:
        if message.tag == "START":
            self.started.setdefault(rank, []).append(message.data)
        elif message.tag == "RESULT":
            result = typed.read(CaseResult, message.data, f"rank {rank}'s RESULT")
            self.results.setdefault(result.key, {})[rank] = result

    def reported(self, rank: int | None) -> set[str]:
        return {key for key, by_rank in self.results.items() if rank in by_rank}

    def settled(self, codes: list[int | None]) -> bool:
        """Every rank still running has reported each case that a failed rank reported."""
        by_failed = set[str]().union(*(self.reported(rank) for rank, code in enumerate(codes)
                                       if code not in (None, 0)))
        return all(by_failed <= self.reported(rank)
                   for rank, code in enumerate(codes) if code is None)

    def in_progress(self, outcome: GroupOutcome) -> set[str]:
        """The cases a group's end interrupted: those the crashed rank started and did not
        report, else those any rank started."""
        if outcome.kind == "crash" and outcome.failed is not None:
            return set(self.started.get(outcome.failed, [])) - self.reported(outcome.failed)
        return {k for keys in self.started.values() for k in keys}


@dataclasses.dataclass
class _Batch:
    """One batch's results so far, and what its groups' failures cost (the circuit breaker)."""

    timeouts: Timeouts
    results: dict[str, CaseResult] = dataclasses.field(default_factory=dict)
    streaks: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    startup_failures: int = 0

    def fail(self, cases: Sequence[Case], failure: str, reason: str, **more: Any
             ) -> list[Case]:
        self.results.update({c.key: CaseResult.failed(c, failure, reason, **more) for c in cases})
        return []

    def left_out(self, cases: Sequence[Case]) -> list[Case]:
        self.results.update({c.key: CaseResult(key=c.key, case=c, status="skip", not_run=True,
                                               reason="not run: the run's time budget was used up")
                             for c in cases})
        return []

    def next_group(self, outcome: GroupOutcome, reports: _Reports, pending: list[Case],
                   remaining: list[Case]) -> list[Case]:
        """The cases the next group runs, once ``outcome`` left ``remaining`` unreported."""
        tails = {f"rank{r}": tuple(t) for r, t in enumerate(outcome.tails)}
        if outcome.kind == "budget":
            return self.left_out(remaining)
        if outcome.ok or outcome.kind in ("fatal", "protocol"):
            why = outcome.failure or "ranks exited without reporting these cases"
            return self.fail(remaining, outcome.kind or "error", f"not run: {why}",
                             log_tail=tails)
        interrupted = reports.in_progress(outcome)
        in_progress = [c for c in remaining if c.key in interrupted]
        if not in_progress:
            # A crash between cases or at start-up: retry, unless twice with no progress.
            progressed = len(remaining) < len(pending)
            self.startup_failures = 0 if progressed else self.startup_failures + 1
            if self.startup_failures < 2:
                return remaining
            return self.fail(remaining, outcome.kind or "error",
                             f"not run: ranks failed twice before a case: {outcome.failure}",
                             log_tail=tails)
        self.startup_failures = 0
        for case in pending:  # a case of an API that ended cleanly resets its streak
            if (done := self.results.get(case.key)) and done.failure not in ("crash", "hang"):
                self.streaks.pop(case.api, None)
        culprit = in_progress[0]
        partial = reports.results.get(culprit.key, {})
        detail = [rec.reason for rec in partial.values() if rec.reason]
        kind = outcome.kind or "crash"
        self.fail([culprit], kind, (outcome.failure or "ranks ended")
                  + (f"; {detail[0]}" if detail else ""),
                  reported_ranks=tuple(sorted(partial)), log_tail=tails)
        # The circuit breaker: too many hangs (crashes) of one API stop its other cases.
        rest = [c for c in remaining if c is not culprit]
        streak = self.streaks.setdefault(culprit.api, {"crash": 0, "hang": 0})
        streak[kind if kind in streak else "crash"] += 1
        if (streak["hang"] < self.timeouts.max_hang_streak
                and streak["crash"] < self.timeouts.max_crash_streak):
            return rest
        self.fail([c for c in rest if c.api == culprit.api], "not attempted",
                  f"not attempted: {streak['hang']} hangs / {streak['crash']} crashes in a "
                  f"row for {culprit.api} (circuit breaker)")
        return [c for c in rest if c.api != culprit.api]


def _spec(cases: Sequence[Case], store: Path, backend: str, allow_multicast: bool
          ) -> RankSpec:
    custom = [c for c in cases if c.api == CUSTOM_API]
    return RankSpec(mode="test", world_size=cases[0].world_size, store=str(store),
                    backend=backend, allow_multicast=allow_multicast,
                    max_tokens=max(c.tokens for c in cases),
                    max_hidden=max(c.hidden for c in cases),
                    custom_max_tokens=max((c.tokens for c in custom), default=1),
                    cases=tuple(cases))


def run_cases(cases: Sequence[Case], variant: Variant, run_dir: Path, *,
              timeouts: Timeouts, backend: str = "trtllm", allow_multicast: bool = False,
              worker: Sequence[str] = (sys.executable, "-m", "sm120fork.gpu.ab.correctness"),
              ) -> list[CaseResult]:
    """Run ``cases`` (one world size, at least one) for ``variant``; crashes and hangs
    become failures."""
    world = cases[0].world_size
    label = "custom" if all(c.api == CUSTOM_API for c in cases) else "fusion"
    batch = _Batch(timeouts)
    pending = list(cases)
    attempt = 0
    while pending:
        if timeouts.deadline is not None and time.monotonic() > timeouts.deadline:
            batch.left_out(pending)
            break
        attempt += 1
        tag = f"{variant.name}-ws{world}-{label}-a{attempt}"
        reports = _Reports()
        outcome = run_ranks(
            worker, functools.partial(_spec, pending, backend=backend,
                                      allow_multicast=allow_multicast),
            world, variant, run_dir / tag, timeouts, reports.on_message,
            settled=reports.settled)
        for case in pending:
            if len(recs := reports.results.get(case.key, {})) == world:
                batch.results[case.key] = _merge(case, recs)
        remaining = [c for c in pending if c.key not in batch.results]
        log.info("%s: %d cases done, %d left%s", tag, len(pending) - len(remaining),
                 len(remaining), f"; {outcome.failure}" if outcome.failure else "")
        pending = batch.next_group(outcome, reports, pending, remaining) if remaining else []
    return [batch.results[c.key] for c in cases if c.key in batch.results]


def default_test_world_sizes(gpu_count: int) -> tuple[int, ...]:
    """2, 4 and 8 as far as the box has GPUs; 2 (sharing it) on a one-GPU box."""
    return tuple(ws for ws in (2, 4, 8) if ws <= max(2, gpu_count))


def _run_matrix(opts: TestOptions, prepared: runs.Prepared, matrix: list[cases_mod.Case]
                ) -> dict[str, list[CaseResult]]:
    """Each variant's results; variants alternate per batch, so a time budget leaves a
    complete A/B of what ran."""
    results: dict[str, list[CaseResult]] = {v.name: [] for v in prepared.variants}
    timeouts = opts.timeouts()
    for batch in cases_mod.phases(matrix):
        ws = batch[0].world_size
        for variant in prepared.variants:
            info = prepared.compiled[variant.name]
            if not info.ok:
                results[variant.name] += [
                    CaseResult.failed(c, "build", f"JIT build failed: {info.failure}",
                                      log_tail={"module build": info.tail}) for c in batch]
                continue
            log.info("variant %s, world size %d: %d cases (%s)", variant.name, ws, len(batch),
                     batch[0].api)
            started = time.monotonic()
            results[variant.name] += run_cases(
                batch, variant, prepared.run_dir, backend=opts.backend,
                allow_multicast=opts.allow_multicast, timeouts=timeouts)
            log.info("variant %s, world size %d took %.0f s", variant.name, ws,
                     time.monotonic() - started)
    return results


def run_test(opts: TestOptions) -> TestRun:
    from sm120fork.gpu.core.reference import tolerance_table

    opts = opts.with_stack(baseline=True)
    prepared = runs.prepare(opts, "test", ["comm"])
    installed, compiled = prepared.variants, prepared.compiled
    names = [v.name for v in installed]
    primary = opts.primary or ("patched" if "patched" in names else names[0])
    if primary not in names:
        raise UsageError(f"--primary {primary} is not a variant", fix=f"one of {names}")
    others = [n for n in names if n != primary]
    baseline = "unpatched" if "unpatched" in others else (others[0] if others else None)
    env = runs.run_environment(compiled, primary, opts.wheel_dirs)
    gpu_count = int(env.get("gpu_count") or 1)
    world_sizes = list(opts.world_sizes or default_test_world_sizes(gpu_count))
    matrix = (cases_mod.quick_matrix if opts.quick else cases_mod.full_matrix)(world_sizes)
    results = _run_matrix(opts, prepared, cases_mod.select(
        matrix, apis=opts.apis, patterns=opts.patterns, tokens=opts.tokens,
        hidden=opts.hidden, max_cases=opts.max_cases))
    doc = AbRun(
        created=now(), command=opts.command,
        title=(f"{opts.title}, " if opts.title else "")
        + f"{(env.get('gpus') or ['?'])[0]} x{env.get('gpu_count', '?')}",
        environment=env, shared=any(ws > gpu_count for ws in world_sizes),
        quick=opts.quick, world_sizes=tuple(world_sizes), primary=primary, baseline=baseline,
        variants={v.name: {**v.describe(), "flashinfer": compiled[v.name].env.get(
            "flashinfer"), "compiled": compiled[v.name].ok,
            "compile_failure": compiled[v.name].failure,
            "prebuilt_failure": compiled[v.name].prebuilt_failure}
            for v in installed},
        tolerances=tuple(tolerance_table()), not_run=opts.not_run,
        results={name: tuple(recs) for name, recs in results.items()},
        module_seconds=round(prepared.module_seconds, 1), time_budget=opts.time_budget,
        finished=not any(r.never_ran for recs in results.values() for r in recs))
    out, roles = runs.run_out(opts, env)
    paths = write_test_report(doc, out, roles)
    recorded = dataclasses.replace(doc, command=opts.record_command or opts.command)
    try:
        tested = opts.tested or records.tested_beside(opts.wheel_dirs.get(primary))
        rec = test_record(recorded, tested)
    except ConfigError as exc:  # the run stands; its record would break the format
        log.error("no record: %s", exc)
        rec = None
    if rec is not None:
        paths.append(records.write(rec, out))
    else:
        log.warning("no record: the tested wheel is no stack's build (no manifest.json "
                    "beside it)")
    runs.collect_logs(prepared.run_dir, out / "logs", roles)
    return TestRun(paths=paths, logs=out / "logs", doc=doc,
                   module_seconds=prepared.module_seconds, allow_partial=opts.allow_partial)


def _detail(rec: CaseResult) -> str:
    if rec.status == "pass":
        return f"rel_l2 {rec.worst:.1e}" if rec.worst else "pass"
    return " ".join(str(rec.reason or rec.status).split())[:200]


def test_record(doc: AbRun, tested: record.Tested | None) -> record.Record | None:
    """The record of a ``gpu test`` run (None: its primary wheel is no stack's build)."""
    manifest = built_manifest(doc.environment)
    if manifest is None or not manifest.stack:
        return None
    table = AbTable(doc)
    project_of = {w.wheel: w.project for w in manifest.wheels}

    def label(name: str) -> str:
        return "upstream" if name == doc.baseline else name

    wheels = [record.TestedWheel(variant=label(name), project=project_of.get(file, "flashinfer"),
                                 file=file, sha256=sha256)
              for name, variant in doc.variants.items()
              if (file := variant.get("wheel")) and (sha256 := variant.get("sha256"))]
    cases = []
    for key in table.order:
        cls = table.cls[key].replace(" ", "-")  # the A/B class as the record names it
        against = cls if cls in record.AGAINST else None
        cases += [record.Case(
            id=key, variant=label(name), detail=_detail(rec),
            outcome=rec.status if rec.status in ("pass", "fail", "skip") else "error",
            against=against if name == doc.primary else None)
            for name, rec in table.rows[key].items()
            if not rec.never_ran]  # never ran: the record is unfinished
    built = [n for n, v in doc.variants.items() if not v.get("compiled", True)]
    notes = [f"the module build of {', '.join(built)} failed: its cases never ran"] if built \
        else []
    if doc.shared:
        notes.append("ranks shared GPUs: correctness only, timings mean nothing")
    return record.make(
        kind="gpu-test", stack=manifest.stack, command=doc.command, created=doc.created,
        toolkit=__version__, machine=records.machine_of(doc.environment, doc.shared),
        tested=records.tested_block(wheels, tested), cases=tuple(cases), notes=tuple(notes),
        planned=sum(len(recs) for recs in doc.results.values()), not_run=doc.not_run)


def rerender(test: Path, out: Path) -> list[Path]:
    return write_test_report(AbRun.read(json_file(test), str(test)), out)
