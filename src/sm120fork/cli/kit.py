"""``gpu-kit``: one self-contained folder for a GPU box with no network (:mod:`sm120fork.kit`)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console

from sm120fork.cli.output import say
from sm120fork.errors import UsageError
from sm120fork.workspace import Workspace


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.kit.build import MIB, KitOptions, make, parse_size
    from sm120fork.resolved import ResolvedStack

    stack = ResolvedStack.of(ws, ws.stack(args.stack))
    harnesses = tuple(args.harness) if args.harness else KitOptions.harnesses
    if args.upstream_pr and "upstream_tests" not in harnesses:
        raise UsageError("--upstream-pr goes with --harness upstream_tests",
                         where="--upstream-pr", fix="add --harness upstream_tests")
    with tempfile.TemporaryDirectory(prefix="sm120fork-kit-prs-") as tmp:
        tests = None
        if "upstream_tests" in harnesses:
            from sm120fork.upstream.groups import write_gpu_tests

            tests = Path(tmp) / "upstream-tests"
            prs = write_gpu_tests(stack, tests, tuple(args.upstream_pr))
            console.print(f"carrying the GPU tests of upstream PR(s) {', '.join(prs)}")
        kit = make(KitOptions(
            python=args.python, out=args.out, harnesses=harnesses,
            box_has=tuple(args.box_has), include=tuple(args.include),
            max_size=parse_size(args.max_size, "--max-size") if args.max_size else None,
            part_size=parse_size(args.part_size, "--part-size") if args.part_size else None,
            prebuilt=args.prebuilt_modules, nox=args.nox, upstream_tests=tests), stack)
    wheels = sum(1 for name in kit.files if name.endswith(".whl"))
    harness = harnesses[0]
    example = f"{harness}{' --quick' if harness in ('gpu_test', 'bench') else ''} --out results"
    if not kit.parts:
        say(console, f"wrote {kit.path}: {wheels} wheels, {kit.size / MIB:.1f} MiB; on the "
            f"box: sh {kit.path}/run {example}")
        return 0
    say(console, *(f"wrote {folder}: {size / MIB:.1f} MiB" for folder, size in kit.parts),
        f"{kit.path} in {len(kit.parts)} parts: {wheels} wheels, {kit.size / MIB:.1f} MiB; "
        f"copy every part to one folder on the box, then: sh {kit.parts[-1][0]}/run {example}")
    return 0


def run_requirements(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.kit.build import stack_requirements
    from sm120fork.resolved import ResolvedStack

    inner = argparse.ArgumentParser(add_help=False)
    inner.add_argument("--stack")
    known, _ = inner.parse_known_args([a for a in args.harness_args if a != "--"])
    harness = "bench" if args.harness == "tune" else args.harness
    for line in stack_requirements(ResolvedStack.named(ws, known.stack), harness):
        print(line)
    return 0
