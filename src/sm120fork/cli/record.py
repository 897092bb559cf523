"""``record import DIR``: bring records made on a GPU box into ``reports/``."""

from __future__ import annotations

import argparse

from rich.console import Console

from sm120fork.workspace import Workspace


def add_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="record_command", required=True, metavar="ACTION")
    imp = sub.add_parser("import", help="validate each record.json under DIR and publish it "
                                        "to reports/<stack>/<kind>/")
    imp.add_argument("directory", metavar="DIR", help="the folder a run wrote its records into")


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from pathlib import Path

    from sm120fork.record import import_records

    for folder in import_records(Path(args.directory), ws.reports_dir):
        console.print(f"published {folder.relative_to(ws.root).as_posix()}/")
    return 0
