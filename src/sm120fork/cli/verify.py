"""``verify-sm120``: every patch's evidence, checked; its record: reports/<stack>/verify-sm120/."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from sm120fork.errors import VerifyError
from sm120fork.workspace import Workspace


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.verify.proof.report import write_reports
    from sm120fork.verify.proof.stack import PROOF_ARCHS, run_verify

    result = run_verify(ws, ws.stack(args.stack), jobs=args.jobs, force=args.force,
                        archs=args.archs or PROOF_ARCHS)
    out = write_reports(ws, result)
    table = Table(title=f"SM12x verification of {result.stack}")
    for col in ("patch", "evidence", "checks", "result"):
        table.add_column(col, overflow="fold")
    for v in result.verdicts:
        table.add_row(v.subject, v.evidence, "\n".join(v.checks),
                      "pass" if v.passed else "FAIL")
    console.print(table)
    full = ws.state_dir / "reports" / "sm120" / result.stack / "verify.md"
    console.print(f"{'PASS' if result.passed else 'FAIL'} in {result.seconds:.0f}s; "
                  f"record: {(out / 'summary.md').relative_to(ws.root)} (full report: "
                  f"{full.relative_to(ws.root)})")
    return 0 if result.passed else VerifyError.exit_code
