"""``verify-sm120``: the compile proof and behaviour checks, rendered."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from sm120fork.workspace import Workspace


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help="stack (default: the default stack)")
    p.add_argument("--jobs", type=int, default=2, help="parallel nvcc runs (default 2)")
    p.add_argument("--force", action="store_true",
                   help="discard local work in the fork trees it needs")


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.verify_sm120 import run_verify, write_reports

    result = run_verify(ws, ws.stack(args.stack), jobs=args.jobs, force=args.force)
    out = write_reports(ws, result)
    table = Table(title="SM12x verification")
    for col in ("patch", "checks", "result"):
        table.add_column(col, overflow="fold")
    for v in result.verdicts:
        table.add_row(v.subject, "\n".join(v.checks), "pass" if v.passed else "FAIL")
    console.print(table)
    console.print(f"{'PASS' if result.passed else 'FAIL'} in {result.seconds:.0f}s; "
                  f"report: {out / 'verify.md'}")
    return 0 if result.passed else 13
