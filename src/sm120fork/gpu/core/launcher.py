"""Groups of rank processes under the one supervisor: one worker per rank, each variant's
environment, every rank's log."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sm120fork.gpu.core.variants import Variant
from sm120fork.util import proc, wire
from sm120fork.util.proc import Child, GroupOutcome


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timeouts(proc.Timeouts):
    """The supervisor's bounds with the launcher's defaults, and its circuit breaker."""

    startup: float | None = 300.0
    idle: float | None = 90.0
    #: hangs (crashes) in a row of one API after which its other cases are not attempted
    max_hang_streak: int = 4
    max_crash_streak: int = 12


def run_ranks(worker: Sequence[str], spec: Callable[[Path], object], world: int,
              variant: Variant, log_stem: Path, timeouts: Timeouts,
              on_message: Callable[[int, wire.Message], None],
              extra_env: Mapping[str, str] | None = None,
              settled: Callable[[list[int | None]], bool] | None = None) -> GroupOutcome:
    """One worker process per rank on the spec file ``spec(store)`` (JSON, a dataclass as its
    fields) beside ``log_stem`` (``spec-<name>.json``, a fresh ``store-<name>``), logging to
    ``<log_stem>-rank<r>.log``."""
    store = log_stem.with_name(f"store-{log_stem.name}")
    store.unlink(missing_ok=True)
    spec_path = log_stem.with_name(f"spec-{log_stem.name}.json")
    spec_path.write_text(json.dumps(spec(store), default=dataclasses.asdict))
    env = {**variant.env(os.environ), **(extra_env or {})}
    return proc.run_group(
        [Child(argv=[*worker, str(spec_path), str(r)], env=env, name=f"rank {r}",
               log=log_stem.with_name(f"{log_stem.name}-rank{r}.log")) for r in range(world)],
        timeouts=timeouts, on_message=on_message, settled=settled)
