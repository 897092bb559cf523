"""``python -m sm120fork doctor`` and the plugin wheel's ``sm120fork-doctor``: print, exit.

The one place of the doctor that prints.  It probes (:mod:`.probe`) or reads recorded
facts (``--facts FILE``), judges them (:mod:`.rules`), and writes the text, or with
``--json`` one JSON object on stdout; ``--record FILE`` saves the probed facts so the
box can be judged again elsewhere.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..entry import Parser, boundary
from ..errors import DoctorError, UsageError
from ..util import proc
from .ipc import probe as ipc_probe
from .probe import SCHEMA, Probes, collect, flashinfer_facts, portable, sglang_decisions
from .rules import Report, judge


def render(report: Report) -> str:
    out: list[str] = []
    section = None
    for name, text in report.lines:
        if name != section:
            out.append(f"[{name}]")
            section = name
        out.append(f"  {text}")
    out.append(f"[blockers] {len(report.blockers)}")
    out += [f"  BLOCKER: {b}" for b in report.blockers]
    return "\n".join(out) + "\n"


def read_facts(path: Path) -> dict[str, Any]:
    try:
        facts: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--facts {path}: cannot read a facts file: {exc}") from exc
    if facts.get("schema") != SCHEMA:
        raise UsageError(f"--facts {path}: schema {facts.get('schema')!r}, this doctor "
                         f"reads {SCHEMA!r}")
    return facts


def parser() -> Parser:
    p = Parser(
        prog="sm120fork-doctor",
        description="Check this box for SGLang's fused all-reduce on SM12x: GPUs, P2P, "
                    "peer writes and reads, packages, the comm module, SGLang's --tp "
                    "decisions. --record saves what it found; --facts judges a record.")
    p.add_argument("--json", action="store_true", help="one JSON object for machines")
    p.add_argument("--record", type=Path, metavar="FILE",
                   help="also write every probed fact to FILE (send it to be re-judged)")
    p.add_argument("--facts", type=Path, metavar="FILE",
                   help="judge the facts recorded in FILE instead of this box (offline)")
    p.add_argument("--tp", type=int, action="append", default=[], metavar="N",
                   help="the --tp you will serve with: a blocker unless it works (repeatable)")
    p.add_argument("--base-gpu-id", type=int, default=0, metavar="I",
                   help="SGLang's --base-gpu-id (its ranks use GPUs I..I+tp-1)")
    p.add_argument("--decide-timeout", type=float, default=300, metavar="S",
                   help="seconds for SGLang's --tp decisions (they import SGLang)")
    p.add_argument("--pair-timeout", type=float, default=30, metavar="S",
                   help="seconds each GPU pair of the peer probe may take before it is "
                        "named a hang")
    return p


def main(argv: Sequence[str] | None = None, probes: Probes | None = None) -> int:
    """The doctor's entry point, in the one error boundary (:mod:`sm120fork.entry`)."""
    return boundary(lambda: _main(argv, probes), name="sm120fork-doctor",
                    on_interrupt=proc.end_children)


def _main(argv: Sequence[str] | None, probes: Probes | None) -> int:
    args = parser().parse_args(argv)
    if args.facts is not None and args.record is not None:
        raise UsageError("--facts judges a record; --record makes one: use one of them")
    if args.facts is not None:
        facts = read_facts(args.facts)
    else:
        facts = collect(probes or Probes(
            peers=functools.partial(ipc_probe, pair_timeout=args.pair_timeout),
            decisions=functools.partial(sglang_decisions, timeout=args.decide_timeout),
            flashinfer=functools.partial(flashinfer_facts, timeout=args.decide_timeout)),
            extra_tp=args.tp)
        if args.record is not None:
            args.record.write_text(json.dumps(portable(facts), indent=1) + "\n",
                                   encoding="utf-8")
    report = judge(facts, base_gpu=args.base_gpu_id, tp=args.tp)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    if args.record is not None:
        sys.stderr.write(f"facts recorded in {args.record}\n")
    if report.blockers:
        return DoctorError(f"{len(report.blockers)} blocker(s)").exit_code
    return 0
