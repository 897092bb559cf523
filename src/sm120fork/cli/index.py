"""``index``: every stack's built wheels as a static package index, rendered."""

from __future__ import annotations

import argparse

from rich.console import Console

from sm120fork.index.write import stack_routes, write_index
from sm120fork.package.publish import shown
from sm120fork.workspace import Workspace


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    index = write_index(ws, url=args.url, out=args.out)
    for note in index.notes:
        console.print(note, markup=False, soft_wrap=True)
    for s in index.stacks:
        for route in stack_routes(index.url, s):
            console.print(f"{s.stack.name}, {route.name}: {route.line}", markup=False,
                          soft_wrap=True)
    console.print(f"wrote {index.files} wheel(s) of {len(index.stacks)} stack(s) into "
                  f"{shown(ws, index.out)}/ (landing page: index.html)", markup=False)
    return 0
