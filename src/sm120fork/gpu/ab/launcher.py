"""Batches of A/B rank processes: correctness cases, crashes and hangs recorded.

Each batch of cases runs in a fresh group of rank processes under the one supervisor
(:mod:`sm120fork.util.supervise`); the ranks speak the one wire format
(:mod:`sm120fork.util.wire`).  When a group ends early, the case that was in progress is
recorded as a failure with every rank's last output lines, and the remaining cases
continue in a new group.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sm120fork.errors import ConfigError
from sm120fork.gpu.core.cases import CUSTOM_API, Case
from sm120fork.gpu.core.launcher import DEFAULT_TIMEOUTS, Timeouts, run_ranks
from sm120fork.gpu.core.variants import Variant
from sm120fork.util import wire


def _merge(case: Case, records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One record per case from every rank's record (a case passes only if all ranks do)."""
    statuses = {r["status"] for r in records.values()}
    merged: dict[str, Any] = {"key": case.key, "case": case.to_dict()}
    if statuses == {"skip"}:
        merged.update(status="skip", reason=next(iter(records.values())).get("reason"))
        return merged
    failing = sorted(r for r, rec in records.items() if rec["status"] != "pass")
    checks: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in records.values():
        for check in rec.get("checks", []):
            k = (check["output"], check["stage"])
            old = checks.get(k)
            if old is None or (old["ok"] and not check["ok"]) or (
                    old["ok"] == check["ok"] and (check.get("rel_l2") or 0) >
                    (old.get("rel_l2") or 0)):
                checks[k] = check
    merged["checks"] = list(checks.values())
    if not failing:
        merged["status"] = "pass"
        return merged
    first = records[failing[0]]
    merged.update(status="fail", failure=first.get("failure") or "wrong result",
                  failing_ranks=failing)
    reasons = [c["reason"] for c in checks.values() if not c["ok"]]
    merged["reason"] = first.get("reason") or ("; ".join(f"{c['output']} ({c['stage']}): "
                                                        f"{c['reason']}"
                                                        for c in checks.values()
                                                        if not c["ok"])[:1500])
    if not merged["reason"] and reasons:
        merged["reason"] = reasons[0]
    if first.get("traceback"):
        merged["traceback"] = first["traceback"]
    return merged


NOT_RUN_REASON = "not run: the run's time budget was used up"


def _not_run(case: Case) -> dict[str, Any]:
    """A case the budget left out: a skip that says so (``not_run``), never a pass."""
    return {"key": case.key, "case": case.to_dict(), "status": "skip", "not_run": True,
            "reason": NOT_RUN_REASON}


@dataclasses.dataclass
class _Reports:
    """What each rank of one group said: the cases it started and those it reported."""

    started: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    reported: dict[int, set[str]] = dataclasses.field(default_factory=dict)

    def settled(self, codes: list[int | None]) -> bool:
        """Every rank still running has reported each case that a failed rank reported:
        a rank that exits right after its report (a poisoned CUDA context) ends the group
        only once the others have reported that case too, or the watchdog gives up."""
        done_by_failed: set[str] = set()
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                done_by_failed |= self.reported.get(rank, set())
        return all(done_by_failed <= self.reported.get(rank, set())
                   for rank, code in enumerate(codes) if code is None)

    def unfinished(self, rank: int) -> list[str]:
        """The cases ``rank`` started and did not report."""
        return [k for k in self.started.get(rank, []) if k not in self.reported.get(rank, set())]


def run_cases(cases: Sequence[Case], variant: Variant, run_dir: Path, *,
              backend: str = "trtllm", allow_multicast: bool = False,
              timeouts: Timeouts = DEFAULT_TIMEOUTS,
              worker: Sequence[str] = (sys.executable, "-m", "sm120fork.gpu.ab.worker"),
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run ``cases`` (one world size) for ``variant``; crashes and hangs become failures."""
    if not cases:
        return []
    world = cases[0].world_size
    if any(c.world_size != world for c in cases):
        raise ConfigError("run_cases takes cases of one world size")
    pending = list(cases)
    label = "custom" if all(c.api == CUSTOM_API for c in cases) else "fusion"
    results: dict[str, dict[str, Any]] = {}
    attempt = 0
    startup_failures = 0
    streaks: dict[str, dict[str, int]] = {}
    env_info: dict[str, Any] = {}
    while pending:
        if timeouts.deadline is not None and time.monotonic() > timeouts.deadline:
            for case in pending:
                results[case.key] = _not_run(case)
            break
        attempt += 1
        tag = f"{variant.name}-ws{world}-{label}-a{attempt}"
        spec_path = run_dir / f"spec-{tag}.json"
        store = run_dir / f"store-{tag}"
        if store.exists():
            store.unlink()
        custom = [c for c in pending if c.api == CUSTOM_API]
        spec_path.write_text(json.dumps({
            "mode": "test", "world_size": world, "store": str(store),
            "backend": backend, "allow_multicast": allow_multicast,
            "max_tokens": max(c.tokens for c in pending),
            "max_hidden": max(c.hidden for c in pending),
            "custom_max_tokens": max((c.tokens for c in custom), default=1),
            "cases": [c.to_dict() for c in pending]}))
        per_rank: dict[str, dict[int, dict[str, Any]]] = {}
        started: list[str] = []
        reports = _Reports()

        def on_message(rank: int, message: wire.Message,
                       per_rank: dict[str, dict[int, dict[str, Any]]] = per_rank,
                       started: list[str] = started, reports: _Reports = reports) -> None:
            tag_, payload = message.tag, message.data
            if tag_ == "START":
                started.append(payload)
                reports.started.setdefault(rank, []).append(payload)
            elif tag_ == "RESULT":
                per_rank.setdefault(payload["key"], {})[rank] = payload
                reports.reported.setdefault(rank, set()).add(payload["key"])
            elif tag_ == "ENV":
                env_info.update(payload)

        outcome = run_ranks(worker, spec_path, world, variant, run_dir / tag, timeouts,
                             on_message, settled=reports.settled)
        remaining = []
        for case in pending:
            recs = per_rank.get(case.key, {})
            if len(recs) == world:
                results[case.key] = _merge(case, recs)
            else:
                remaining.append(case)
        if progress:
            progress(f"{tag}: {len(pending) - len(remaining)} cases done, "
                     f"{len(remaining)} left" + (f"; {outcome.failure}" if outcome.failure
                                                 else ""))
        if not remaining:
            break
        tails = {f"rank{r}": t for r, t in enumerate(outcome.tails)}
        if outcome.kind == "budget":
            for case in remaining:
                results[case.key] = _not_run(case)
            break
        if outcome.ok or outcome.kind in ("fatal", "protocol"):
            why = outcome.failure or "ranks exited without reporting these cases"
            for case in remaining:
                results[case.key] = {"key": case.key, "case": case.to_dict(), "status": "fail",
                                     "failure": outcome.kind or "error",
                                     "reason": f"not run: {why}", "log_tail": tails}
            break
        if outcome.kind == "crash" and outcome.failed is not None:
            # The case the crashed rank was on; none when it crashed after reporting its
            # last case (the others' next case is not to blame for its exit).
            mine = set(reports.unfinished(outcome.failed))
            in_progress = [c for c in remaining if c.key in mine]
        else:
            in_progress = [c for c in remaining if c.key in set(started)]
        if not in_progress:
            # Nothing was running when the group ended: a crash between cases (after a
            # case that reported, e.g. a CUDA error that poisoned the context) or a
            # start-up failure.  Retry; two start-up failures in a row with no progress
            # mean the ranks cannot start.
            progressed = len(remaining) < len(pending)
            startup_failures = 0 if progressed else startup_failures + 1
            if startup_failures >= 2:
                for case in remaining:
                    results[case.key] = {
                        "key": case.key, "case": case.to_dict(), "status": "fail",
                        "failure": outcome.kind or "error",
                        "reason": f"not run: ranks failed twice before a case: "
                                  f"{outcome.failure}", "log_tail": tails}
                break
            pending = remaining
            continue
        startup_failures = 0
        for case in pending:
            if case.key in results and results[case.key].get("failure") not in ("crash", "hang"):
                streaks.pop(case.api, None)
        culprit = in_progress[0]
        partial = per_rank.get(culprit.key, {})
        reason = outcome.failure or "ranks ended"
        detail = [rec.get("reason") for rec in partial.values() if rec.get("reason")]
        results[culprit.key] = {
            "key": culprit.key, "case": culprit.to_dict(), "status": "fail",
            "failure": outcome.kind or "crash",
            "reason": reason + (f"; {detail[0]}" if detail else ""),
            "reported_ranks": sorted(partial), "log_tail": tails}
        pending = [c for c in remaining if c is not culprit]
        kind = outcome.kind or "crash"
        streak = streaks.setdefault(culprit.api, {"crash": 0, "hang": 0})
        streak[kind if kind in streak else "crash"] += 1
        if (streak["hang"] >= timeouts.max_hang_streak
                or streak["crash"] >= timeouts.max_crash_streak):
            why = (f"not attempted: {streak['hang']} hangs / {streak['crash']} crashes in a row "
                   f"for {culprit.api} (circuit breaker)")
            for case in [c for c in pending if c.api == culprit.api]:
                results[case.key] = {"key": case.key, "case": case.to_dict(),
                                     "status": "fail", "failure": "not attempted",
                                     "reason": why}
            pending = [c for c in pending if c.api != culprit.api]
    ordered = [results[c.key] for c in cases if c.key in results]
    if env_info and ordered:
        ordered[0].setdefault("env", env_info)
    return ordered
