"""Entry point of one rank process: ``python -m sm120fork.gpu.worker SPEC [RANK]``.

The spec's mode picks the job: ``compile`` (build/load FlashInfer's modules once),
``test`` (:mod:`.correctness`) or ``bench`` (:mod:`.timing`); the rank state is
:mod:`.rank`.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from sm120fork.gpu.core.cases import BenchPlan, Case
from sm120fork.gpu.core.probe import environment, run_compile
from sm120fork.gpu.core.rank import Rank, hard_exit, say
from sm120fork.gpu.correctness import run_tests
from sm120fork.gpu.timing import run_bench


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    mode = spec["mode"]
    if mode == "compile":
        run_compile(list(spec.get("modules", ["comm"])))
        say("DONE")
        return 0
    rank = int(argv[1])
    rk = Rank(spec, rank)
    if rank == 0:
        say("ENV", {**environment(), "shared": rk.shared, "world_size": rk.world})
    if mode == "test":
        run_tests(rk, [Case.from_dict(c) for c in spec["cases"]])
    elif mode == "bench":
        run_bench(rk, BenchPlan.from_dict(spec["bench"]), list(spec["methods"]))
    else:
        raise ValueError(f"unknown mode {mode}")
    rk.barrier()
    say("DONE")
    hard_exit(0)
    return 0


if __name__ == "__main__":
    try:
        hard_exit(main(sys.argv[1:]))
    except Exception:
        traceback.print_exc()
        hard_exit(1)
