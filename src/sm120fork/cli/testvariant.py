"""``build-test-variant``: a project's series plus its test series, built, never published."""

from __future__ import annotations

import argparse

from rich.console import Console

from sm120fork.workspace import Workspace


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.package.variant import build_test_variant
    from sm120fork.resolved import ResolvedStack

    wheel = build_test_variant(ResolvedStack.named(ws, args.stack), project_key=args.project,
                               name=args.name, force=args.force)
    console.print(f"test variant: {wheel.relative_to(ws.root)}")
    return 0
