"""One group of bench rank processes: every method of the group, checked then timed."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sm120fork.gpu.core.cases import BenchPlan
from sm120fork.gpu.core.documents import BenchRecord, Environment
from sm120fork.gpu.core.launcher import Timeouts, run_ranks
from sm120fork.gpu.core.variants import Variant
from sm120fork.util import wire
from sm120fork.util.supervise import GroupOutcome


def run_group(plan: BenchPlan, variant: Variant, run_dir: Path, *,
              methods: Sequence[str], tag: str = "bench",
              extra_env: Mapping[str, str] | None = None,
              module_failures: Mapping[str, str] | None = None,
              timeouts: Timeouts, backend: str = "trtllm", allow_multicast: bool = False,
              worker: Sequence[str] = (sys.executable, "-m", "sm120fork.gpu.bench.worker"),
              ) -> tuple[list[BenchRecord], Environment, GroupOutcome]:
    """Run one bench group of ``methods``: (bench records, environment, outcome)."""
    name = f"{tag}-{variant.name}"
    spec_path = run_dir / f"spec-{name}.json"
    store = run_dir / f"store-{name}"
    store.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({
        "mode": "bench", "world_size": plan.world_size, "store": str(store),
        "backend": backend, "allow_multicast": allow_multicast,
        "max_tokens": max(plan.tokens), "max_hidden": max(plan.hidden),
        "bench": dataclasses.asdict(plan), "methods": list(methods),
        "module_failures": dict(module_failures or {})}))
    records: list[BenchRecord] = []
    env_info: Environment = {}

    def on_message(rank: int, message: wire.Message) -> None:
        if message.tag == "BENCH" and rank == 0:
            records.append(message.data)
        elif message.tag == "ENV":
            env_info.update(message.data)

    outcome = run_ranks(worker, spec_path, plan.world_size, variant, run_dir / name,
                        timeouts, on_message, extra_env)
    return records, env_info, outcome
