"""Batches of A/B rank processes; when a group ends early, the case in progress fails with
every rank's last lines and the rest continue in a new group."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sm120fork.gpu.ab.results import CaseResult, Check, GroupSpec
from sm120fork.gpu.core.cases import CUSTOM_API, Case
from sm120fork.gpu.core.variants import Timeouts, Variant, run_ranks
from sm120fork.util import typed, wire
from sm120fork.util.proc import GroupOutcome


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
        for case in pending:
            if case.key in self.results and self.results[case.key].failure not in ("crash",
                                                                                   "hang"):
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
          ) -> GroupSpec:
    custom = [c for c in cases if c.api == CUSTOM_API]
    return GroupSpec(mode="test", world_size=cases[0].world_size, store=str(store),
                    backend=backend, allow_multicast=allow_multicast,
                    max_tokens=max(c.tokens for c in cases),
                    max_hidden=max(c.hidden for c in cases),
                    custom_max_tokens=max((c.tokens for c in custom), default=1),
                    cases=tuple(cases))


def run_cases(cases: Sequence[Case], variant: Variant, run_dir: Path, *,
              timeouts: Timeouts, backend: str = "trtllm", allow_multicast: bool = False,
              worker: Sequence[str] = (sys.executable, "-m", "sm120fork.gpu.ab.correctness"),
              progress: Callable[[str], None] = lambda _line: None) -> list[CaseResult]:
    """Run ``cases`` (one world size, at least one) for ``variant``; crashes and hangs
    become failures."""
    world = cases[0].world_size
    label = "custom" if all(c.api == CUSTOM_API for c in cases) else "fusion"
    batch = _Batch(timeouts)
    pending = list(cases)
    for attempt in itertools.count(1):
        if not pending:
            break
        if timeouts.deadline is not None and time.monotonic() > timeouts.deadline:
            batch.left_out(pending)
            break
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
        progress(f"{tag}: {len(pending) - len(remaining)} cases done, {len(remaining)} left"
                 + (f"; {outcome.failure}" if outcome.failure else ""))
        pending = batch.next_group(outcome, reports, pending, remaining) if remaining else []
    return [batch.results[c.key] for c in cases if c.key in batch.results]
