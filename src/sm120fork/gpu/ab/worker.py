"""One A/B rank: ``python -m sm120fork.gpu.ab.worker SPEC RANK``."""

from __future__ import annotations

from sm120fork.gpu.ab.correctness import run_tests
from sm120fork.gpu.ab.results import GroupSpec
from sm120fork.gpu.core import worker
from sm120fork.gpu.core.rank import Rank
from sm120fork.util import typed


def run(rank: Rank, spec: object) -> None:
    run_tests(rank, list(typed.read(GroupSpec, spec, "the group's spec").cases))


if __name__ == "__main__":
    worker.serve({"test": run})
