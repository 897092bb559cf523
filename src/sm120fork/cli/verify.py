"""``verify-sm120``: every patch's evidence, checked, its record in
reports/<stack>/verify-sm120/; ``record import DIR``: records made on a GPU box, imported."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from sm120fork.cli.output import table
from sm120fork.errors import VerifyError
from sm120fork.workspace import Workspace


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.verify.proof.stack import PROOF_ARCHS, run_verify, write_reports

    result = run_verify(ws, ws.stack(args.stack), jobs=args.jobs, force=args.force,
                        archs=args.archs or PROOF_ARCHS)
    out = write_reports(ws, result)
    rows = table(f"SM12x verification of {result.stack}",
                 ("patch", "evidence", "checks", "result"), fold=True)
    for v in result.verdicts:
        rows.add_row(v.subject, v.evidence, "\n".join(v.checks), "pass" if v.passed else "FAIL")
    console.print(rows)
    full = ws.state_dir / "reports" / "sm120" / result.stack / "verify.md"
    console.print(f"{'PASS' if result.passed else 'FAIL'} in {result.seconds:.0f}s; "
                  f"record: {(out / 'summary.md').relative_to(ws.root)} (full report: "
                  f"{full.relative_to(ws.root)})")
    return 0 if result.passed else VerifyError.exit_code


def run_record(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.record import import_records

    for folder in import_records(Path(args.directory), ws.reports_dir):
        console.print(f"published {folder.relative_to(ws.root).as_posix()}/")
    return 0
