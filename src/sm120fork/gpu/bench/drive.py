"""The bench's driver: every method checked against the fp32 reference, then timed.

The bench drives every method of :data:`sm120fork.gpu.methods.METHODS` the same way
(:func:`drive`): a method that cannot run on this machine says why and is reported as not
runnable, one whose output does not match the reference is reported with its failing
check and never timed, and only the rest are timed.  Nothing here imports torch, so the
driver is unit-tested on CPU with fake adapters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sm120fork.gpu.methods import ERROR, FAILED_CHECK, METHODS, NOT_RUNNABLE, STARTING, TIMED


def group_envs(names: Iterable[str]) -> dict[tuple[tuple[str, str], ...], list[str]]:
    """Methods grouped by the environment their rank group needs (one group each)."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in names:
        key = tuple(sorted(METHODS[name].env.items()))
        groups.setdefault(key, []).append(name)
    return groups


def modules(names: Iterable[str]) -> list[str]:
    """The optional modules the module step builds for these methods."""
    return sorted({m for n in names if (m := METHODS[n].module)})


def select(names: Sequence[str] | None) -> list[str]:
    """The methods to run, in registry order; unknown names are refused by the caller."""
    if not names:
        return list(METHODS)
    return [name for name in METHODS if name in set(names)]


@dataclasses.dataclass(frozen=True)
class Point:
    tokens: int
    hidden: int


#: check(adapter, point) -> (ok, checks); time(adapter, point) -> stats;
#: emit(record) sends a record to the launcher; sync() is a barrier between ranks
Check = Callable[[Any, Point], tuple[bool, list[dict[str, Any]]]]
Time = Callable[[Any, Point], dict[str, Any]]


def agree(reasons: Sequence[str | None]) -> str | None:
    """One verdict for the group from every rank's: a method runs only if it runs on all."""
    bad = [(rank, r) for rank, r in enumerate(reasons) if r]
    if not bad:
        return None
    rank, reason = bad[0]
    return reason if len(bad) == len(reasons) else f"rank {rank}: {reason}"


def drive(adapters: Sequence[Any], points: Sequence[Point], *, check: Check, time: Time,
          emit: Callable[[dict[str, Any]], None],
          gather: Callable[[Any], list[Any]] = lambda x: [x],
          is_fatal: Callable[[BaseException], bool] = lambda _exc: False) -> None:
    """Check, then time, every runnable method at every point; report the others.

    Methods one after the other, each over every point; a ``kind: method`` record
    with status ``starting`` before each tells the launcher which method was running
    if the ranks die.

    ``gather`` collects one value from every rank (identity on one rank), so that every
    rank takes the same branch: a method is checked only where every rank can run it,
    and timed only where every rank's check passed.  ``is_fatal`` says which errors
    poisoned the process (they propagate; the launcher restarts nothing for the bench).
    """
    # Method by method, each set up just before its points: a method that kills the
    # ranks (a CUDA error poisons the context) leaves the methods before it measured,
    # and its "starting" record tells the launcher which one to skip when it resumes.
    def attempt(call: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        """``call(*args)``, or None and the error it raised (a fatal one propagates)."""
        try:
            return call(*args), None
        except Exception as exc:
            if is_fatal(exc):
                raise
            return None, f"{type(exc).__name__}: {exc}"

    for adapter in adapters:
        emit({"kind": "method", "method": adapter.name, "status": STARTING})
        own, error = attempt(adapter.unavailable)
        reason = agree(gather(own if error is None else f"set-up failed: {error}"[:500]))
        if reason:
            emit({"kind": "method", "method": adapter.name, "status": NOT_RUNNABLE,
                  "reason": reason})
            continue
        for point in points:
            record: dict[str, Any] = {"kind": "point", "method": adapter.name,
                                      "tokens": point.tokens, "hidden": point.hidden}
            reason = agree(gather(adapter.unsupported(point)))
            if reason:
                emit({**record, "status": NOT_RUNNABLE, "reason": reason})
                continue
            checked, error = attempt(check, adapter, point)
            ok, checks = checked if error is None else (
                False, [{"output": "call", "ok": False, "reason": error[:500]}])
            verdicts = gather((ok, checks))
            if not all(v[0] for v in verdicts):
                failing = [rank for rank, v in enumerate(verdicts) if not v[0]]
                worst = verdicts[failing[0]][1]
                emit({**record, "status": FAILED_CHECK, "failing_ranks": failing,
                      "checks": worst,
                      "reason": "; ".join(str(c.get("reason")) for c in worst
                                          if not c.get("ok"))[:800]})
                continue
            stats, error = attempt(time, adapter, point)
            every = gather(stats if error is None else {"error": error[:500]})
            if any("error" in s for s in every):
                emit({**record, "status": ERROR,
                      "reason": next(s["error"] for s in every if "error" in s)})
                continue
            emit({**record, "status": TIMED, **stats,
                  "checks": checks,
                  "rank_medians_us": [s["median_us"] for s in every],
                  "rank_p90_us": [s["p90_us"] for s in every]})
