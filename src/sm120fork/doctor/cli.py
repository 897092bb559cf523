"""``python -m sm120fork doctor`` and the plugin wheel's ``sm120fork-doctor``: print, exit.

The one place of the doctor that prints; the checks themselves return a ``Report``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..errors import DoctorError
from .checks import Probes, Report, examine, sglang_decisions


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


def main(argv: Sequence[str] | None = None, probes: Probes | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sm120fork-doctor",
        description="Check this box for SGLang's fused all-reduce on SM12x: GPUs, P2P, "
                    "peer writes, packages, the comm module, SGLang's decisions.")
    parser.add_argument("--json", action="store_true", help="one JSON object for machines")
    parser.add_argument("--decide-timeout", type=float, default=300, metavar="S",
                        help="seconds for SGLang's TP 2/4/8 decision (it imports SGLang)")
    args = parser.parse_args(argv)
    timeout = args.decide_timeout
    report = examine(probes or Probes(decisions=lambda: sglang_decisions(timeout)))
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    if report.blockers:
        return DoctorError(f"{len(report.blockers)} blocker(s)").exit_code
    return 0
