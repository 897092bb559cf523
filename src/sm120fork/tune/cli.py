"""``python -m sm120fork tune`` (``nox -s tune -- ...``): parse, run :mod:`.run`, print.

The real box: the doctor's own probes, the bench of ``gpu/bench/run.py`` one TP size at a
time (its reports and logs under ``--work-dir``), the question on the terminal.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sm120fork import record
from sm120fork.errors import EXIT_INTERRUPTED, VerifyError
from sm120fork.gpu.bench import run as bench_run
from sm120fork.gpu.cli import resolved_stack, sizes
from sm120fork.gpu.core import records, runs, safety
from sm120fork.tune.run import Box, TuneOptions, WorldBench, tune
from sm120fork.util import hint, proc

if TYPE_CHECKING:
    from sm120fork.resolved import ResolvedStack


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, metavar="NAME",
                        help="the stack whose built wheels (wheels/NAME/) the bench runs")
    parser.add_argument("--world-sizes", metavar="N,N",
                        type=functools.partial(sizes, refusal="TP sizes are integers >= 2"),
                        help="measure these TP sizes (default: every size the doctor says "
                        "this box can run)")
    parser.add_argument("--yes", action="store_true",
                        help="replace an installed policy without asking")
    parser.add_argument("--quick", action="store_true",
                        help="the bench's quick subset (fewer token counts, one hidden size)")
    parser.add_argument("--time-budget", type=float, metavar="SECONDS",
                        help="stop this long after the doctor: the bench starts no case "
                        "after it, and the policy holds only the TP sizes that finished")
    parser.add_argument("--reports", type=Path, default=Path("reports"),
                        help="where the record goes (<reports>/<stack>/policy/)")
    # --wheel-dir patched=WHEEL: bench that build instead of wheels/NAME/ (the kit's `run
    # tune` passes its own); --stack still names the record
    runs.variant_args(parser)


def _bench(args: argparse.Namespace, command: str, stack: ResolvedStack | None
           ) -> Callable[[int, float | None], WorldBench]:
    def bench(tp: int, left: float | None) -> WorldBench:
        out = args.work_dir / "tune" / f"tp{tp}"
        bench_run.run_bench(bench_run.BenchOptions(
            command=command, stack=stack, wheel_dirs=runs.parse_variant_specs(args.wheel_dir),
            prebuilt=runs.parse_variant_specs(args.prebuilt), out=out, work_dir=args.work_dir,
            world_sizes=(tp,), quick=args.quick, time_budget=left, allow_partial=True))
        doc = json.loads((out / "bench.json").read_text(encoding="utf-8"))
        plan = doc.get("plan") or {}
        return WorldBench(
            world=tp, records=list(doc["records"]), tokens=tuple(plan.get("tokens", ())),
            hidden=tuple(plan.get("hidden", ())), methods=tuple(doc.get("methods", ())),
            finished=bool(doc.get("finished")), shared=bool(doc.get("shared")),
            failure=(doc.get("outcome") or {}).get("failure"),
            flashinfer=(doc.get("environment") or {}).get("flashinfer"),
            wheel=(doc["wheel"], doc["sha256"]) if doc.get("wheel") and doc.get("sha256")
            else None)
    return bench


def _tested(args: argparse.Namespace, stack: ResolvedStack | None) -> record.Tested | None:
    """What the benched build was made from: ``tested.json`` beside a given wheel (the
    kit's stack/), else the stack's build in this checkout."""
    if stack is not None:
        return stack.tested()
    return records.tested_beside(runs.parse_variant_specs(args.wheel_dir).get("patched"))


def _ask(question: str) -> bool:
    sys.stderr.write(question)
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def ready() -> None:
    """This Python's torch sees a GPU (the bench's own preflight), before anything runs."""
    safety.require_gpu()


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from sm120fork.doctor.probe import collect

    ready()
    # As typed (the offline kit's entry names itself, without this box's paths).
    command = os.environ.get(safety.COMMAND_ENV) or hint.command("tune", *argv)
    # the stack whose build is benched, resolved once (None: --wheel-dir gives the build)
    stack = None if args.wheel_dir else resolved_stack(args.stack)
    done = tune(TuneOptions(stack=args.stack, command=command.strip(), reports=args.reports,
                            world_sizes=tuple(args.world_sizes) if args.world_sizes else None,
                            yes=args.yes, time_budget=args.time_budget,
                            tested=_tested(args, stack)),
                Box(doctor=collect, bench=_bench(args, command, stack),
                    ask=_ask if sys.stdin.isatty() else None, stop=proc.end_children))
    print("\n".join(done.lines()))
    if done.interrupted:
        return EXIT_INTERRUPTED
    if not done.measured:
        raise VerifyError("nothing was measured: no policy installed",
                          fix="see the lines above for each TP size's reason")
    return VerifyError.exit_code if done.cut_short else 0
