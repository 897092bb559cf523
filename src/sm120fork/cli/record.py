"""``record import DIR``: bring records made on a GPU box into ``reports/``."""

from __future__ import annotations

import argparse

from rich.console import Console

from sm120fork.workspace import Workspace


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from pathlib import Path

    from sm120fork.record import import_records

    for folder in import_records(Path(args.directory), ws.reports_dir):
        console.print(f"published {folder.relative_to(ws.root).as_posix()}/")
    return 0
