"""One bench rank: ``python -m sm120fork.gpu.bench.worker SPEC RANK``."""

from __future__ import annotations

from typing import Any

from sm120fork.gpu.bench.timing import measure
from sm120fork.gpu.core import worker
from sm120fork.gpu.core.cases import BenchPlan
from sm120fork.gpu.core.rank import Rank
from sm120fork.util import typed


def run(rank: Rank, spec: dict[str, Any]) -> None:
    measure(rank, typed.read(BenchPlan, spec["bench"], "the bench spec: bench"),
            list(spec["methods"]))


if __name__ == "__main__":
    worker.serve({"bench": run})
