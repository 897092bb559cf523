"""What crosses the A/B's processes: a group's :class:`GroupSpec`, a case's
:class:`CaseResult` and the run's ``test-ab.json`` (:class:`AbRun`), serialized once at the
edge and read back by ``util.typed.read``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sm120fork.errors import ConfigError
from sm120fork.gpu.core.cases import Case
from sm120fork.gpu.core.documents import Environment, MadeFrom, VariantInfo
from sm120fork.util import typed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    output: str
    stage: str
    ok: bool
    kind: str = ""
    rel_l2: float | None = None
    max_abs: float | None = None
    nonfinite: int = 0
    reason: str = ""

    def worse_than(self, other: Check) -> bool:
        if self.ok != other.ok:
            return not self.ok
        return (self.rel_l2 or 0) > (other.rel_l2 or 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseResult:
    """One case's result: one rank's (``rank`` set), or every rank's merged (``case`` set)."""

    key: str
    status: str
    case: Case | None = None
    rank: int | None = None
    failure: str | None = None
    reason: str | None = None
    checks: tuple[Check, ...] = ()
    note: str | None = None
    traceback: str | None = None
    #: left out by the time budget: a skip that says so, never a pass
    not_run: bool = False
    failing_ranks: tuple[int, ...] = ()
    reported_ranks: tuple[int, ...] = ()
    log_tail: Mapping[str, tuple[str, ...]] | None = None

    @property
    def never_ran(self) -> bool:
        return self.not_run or self.failure == "build"

    @classmethod
    def failed(cls, case: Case, failure: str, reason: str, **more: Any) -> CaseResult:
        return cls(key=case.key, case=case, status="fail", failure=failure, reason=reason,
                   **more)

    @classmethod
    def left_out(cls, case: Case) -> CaseResult:
        return cls(key=case.key, case=case, status="skip", not_run=True,
                   reason="not run: the run's time budget was used up")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """One group of A/B ranks' spec file (:class:`~sm120fork.gpu.core.rank.Rank` reads it too)."""

    world_size: int
    store: str
    backend: str
    allow_multicast: bool
    max_tokens: int
    max_hidden: int
    custom_max_tokens: int
    cases: tuple[Case, ...]
    mode: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbRun:
    """``test-ab.json``: each variant's case results and what the report says of the run."""

    kind: str = "gpu-test"
    created: str = "?"
    command: str = "python -m sm120fork.gpu test"
    title: str = ""
    environment: Environment = dataclasses.field(default_factory=Environment)
    shared: bool = False
    quick: bool = False
    world_sizes: tuple[int, ...] = ()
    primary: str
    baseline: str | None = None
    variants: Mapping[str, VariantInfo] = dataclasses.field(default_factory=dict)
    tolerances: tuple[tuple[str, str], ...] = ()
    not_run: tuple[str, ...] = ()
    results: Mapping[str, tuple[CaseResult, ...]]
    module_seconds: float | None = None
    time_budget: float | None = None
    finished: bool | None = None
    stack: str | None = None
    made_from: tuple[MadeFrom, ...] | None = None

    @classmethod
    def read(cls, data: object, where: str) -> AbRun:
        run = typed.read(cls, data, where, strict=False)
        if run.primary not in run.results:
            raise ConfigError(f"names no results of the primary variant {run.primary!r}",
                              where=f"{where}: results",
                              fix=f"known: {', '.join(run.results) or 'none'}")
        return run
