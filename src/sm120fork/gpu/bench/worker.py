"""One bench rank: ``python -m sm120fork.gpu.bench.worker SPEC RANK``."""

from __future__ import annotations

import dataclasses

from sm120fork.gpu.bench.timing import measure
from sm120fork.gpu.core import worker
from sm120fork.gpu.core.cases import BenchPlan
from sm120fork.gpu.core.rank import Rank
from sm120fork.util import typed


@dataclasses.dataclass(frozen=True)
class _BenchSpec:
    """What a bench rank reads of the group's spec (the rest is :class:`Rank`'s)."""

    bench: BenchPlan
    methods: list[str]


def run(rank: Rank, spec: object) -> None:
    read = typed.read(_BenchSpec, spec, "the bench spec", strict=False)
    measure(rank, read.bench, read.methods)


if __name__ == "__main__":
    worker.serve({"bench": run})
