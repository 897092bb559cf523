"""``build-test-variant``: a project's series plus its test series, built, never published."""

from __future__ import annotations

import argparse

from rich.console import Console

from sm120fork.workspace import Workspace


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help="stack (default: the default stack)")
    p.add_argument("--project", default="flashinfer", help="project key (default flashinfer)")
    p.add_argument("--name", required=True,
                   help="variant name, appended to the local label (e.g. f5test)")
    p.add_argument("--force", action="store_true",
                   help="discard local work in the variant's fork tree")


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.package.variant import build_test_variant

    wheel = build_test_variant(ws, ws.stack(args.stack), project_key=args.project,
                               name=args.name, force=args.force)
    console.print(f"test variant: {wheel.relative_to(ws.root)}")
    return 0
