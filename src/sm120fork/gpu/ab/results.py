"""What crosses the A/B's processes, typed: the parent's request to a rank group
(:class:`GroupSpec`, the spec file) and a case's result (:class:`CaseResult`: each rank's over
the wire, then one merged from every rank's, then a row of ``test-ab.json``).  Each is
serialized once at its edge (``dataclasses.asdict``) and read back by ``util.typed.read``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sm120fork.gpu.core.cases import Case


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    """One output of a case compared with the fp32 reference at one stage."""

    output: str
    stage: str
    ok: bool
    kind: str = ""
    rel_l2: float | None = None
    max_abs: float | None = None
    nonfinite: int = 0
    reason: str = ""

    def worse_than(self, other: Check) -> bool:
        """Failing beats passing; between equals, the larger error."""
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
    #: each rank's (or the module build's) last output lines
    log_tail: Mapping[str, tuple[str, ...]] | None = None

    @property
    def never_ran(self) -> bool:
        """Left out by a time budget, or its variant's module did not build."""
        return self.not_run or self.failure == "build"

    @classmethod
    def failed(cls, case: Case, failure: str, reason: str, **more: Any) -> CaseResult:
        return cls(key=case.key, case=case, status="fail", failure=failure, reason=reason,
                   **more)

    @classmethod
    def left_out(cls, case: Case) -> CaseResult:
        """A case the time budget left out."""
        return cls(key=case.key, case=case, status="skip", not_run=True,
                   reason="not run: the run's time budget was used up")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """What one group of A/B ranks runs (the spec file; :class:`~sm120fork.gpu.core.rank.Rank`
    reads the group's keys from the same file)."""

    world_size: int
    store: str
    backend: str
    allow_multicast: bool
    max_tokens: int
    max_hidden: int
    custom_max_tokens: int
    cases: tuple[Case, ...]
    mode: str

