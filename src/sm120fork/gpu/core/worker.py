"""The frame of one rank process: ``python -m sm120fork.gpu.<harness>.worker SPEC [RANK]``;
mode ``compile`` (:mod:`.probe`) is what ``python -m sm120fork.gpu.core.worker SPEC`` runs."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sm120fork.gpu.core.probe import environment, run_compile
from sm120fork.gpu.core.rank import Rank, hard_exit, say

Job = Callable[[Rank, dict[str, Any]], None]


def main(argv: list[str], jobs: Mapping[str, Job]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    mode = spec["mode"]
    if mode == "compile":
        run_compile(list(spec.get("modules", ["comm"])))
        say("DONE")
        return 0
    job = jobs.get(mode)
    if job is None:  # another harness's spec: refused before the rank joins its group
        raise ValueError(f"unknown mode {mode}")
    rank = int(argv[1])
    rk = Rank(spec, rank)
    if rank == 0:
        say("ENV", {**environment(), "shared": rk.shared, "world_size": rk.world})
    job(rk, spec)
    rk.barrier()
    say("DONE")
    hard_exit(0)
    return 0


def serve(jobs: Mapping[str, Job]) -> None:
    """A worker module's ``__main__``: run, and leave without torch's atexit handlers."""
    try:
        hard_exit(main(sys.argv[1:], jobs))
    except Exception:
        traceback.print_exc()
        hard_exit(1)


if __name__ == "__main__":
    serve({})
