"""``gpu-kit``: one self-contained folder for a GPU box with no network (:mod:`sm120fork.kit`)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console

from sm120fork.errors import UsageError
from sm120fork.workspace import Workspace


def add_args(p: argparse.ArgumentParser) -> None:
    from sm120fork.kit.build import DEFAULT_HARNESSES, HARNESSES

    p.add_argument("--stack", help="stack (default: the default stack)")
    p.add_argument("--python", required=True, metavar="X.Y",
                   help="the box's Python that has torch, e.g. 3.12")
    p.add_argument("--out", type=Path, required=True, help="the kit's folder (replaced)")
    p.add_argument("--harness", action="append", choices=HARNESSES,
                   help="only these harnesses' wheels (default: "
                   f"{', '.join(DEFAULT_HARNESSES)}; sglang_layer carries SGLang's imports)")
    p.add_argument("--box-has", action="append", default=[], metavar="FILE|NAMES",
                   help="what the box has already, left out of the kit: a file of "
                   "`python3 -m pip list --format=freeze` there, or comma-separated names")
    p.add_argument("--include", action="append", default=[], metavar="NAME",
                   help="carry this requirement even if the box has it")
    p.add_argument("--max-size", metavar="SIZE",
                   help="refuse a kit larger than this (e.g. 64MiB), naming what is big")
    p.add_argument("--part-size", metavar="SIZE",
                   help="write the kit as DIR.1 ... DIR.N, each at most SIZE (e.g. 60MiB), "
                   "for a transfer path with a size limit; larger files are cut into pieces "
                   "and any part's run joins and checks them on the box")
    p.add_argument("--prebuilt-modules", type=Path, metavar="DIR",
                   help="comm modules compiled here for a box without nvcc: "
                   "DIR/<variant>/<module>/<module>.so (variant patched or unpatched)")
    p.add_argument("--upstream-pr", action="append", default=[], metavar="NAME",
                   help="with --harness upstream_tests: carry this PR's GPU tests (default: "
                   "every upstream PR of the stack that has some)")
    p.add_argument("--no-nox", dest="nox", action="store_false",
                   help="leave out nox and setuptools (the checkout's sessions offline)")


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.kit.build import MIB, KitOptions, make, parse_size

    stack = ws.stack(args.stack).name
    harnesses = tuple(args.harness) if args.harness else KitOptions.harnesses
    if args.upstream_pr and "upstream_tests" not in harnesses:
        raise UsageError("--upstream-pr goes with --harness upstream_tests",
                         where="--upstream-pr", fix="add --harness upstream_tests")
    with tempfile.TemporaryDirectory(prefix="sm120fork-kit-prs-") as tmp:
        tests = None
        if "upstream_tests" in harnesses:
            from sm120fork.upstream.groups import write_gpu_tests

            tests = Path(tmp) / "upstream-tests"
            prs = write_gpu_tests(ws, stack, tests, tuple(args.upstream_pr))
            console.print(f"carrying the GPU tests of upstream PR(s) {', '.join(prs)}")
        kit = make(KitOptions(
            stack=stack, python=args.python, out=args.out, harnesses=harnesses,
            box_has=tuple(args.box_has), include=tuple(args.include),
            max_size=parse_size(args.max_size, "--max-size") if args.max_size else None,
            part_size=parse_size(args.part_size, "--part-size") if args.part_size else None,
            prebuilt=args.prebuilt_modules, nox=args.nox, upstream_tests=tests),
            root=ws.root)
    wheels = sum(1 for name in kit.files if name.endswith(".whl"))
    harness = harnesses[0]
    example = f"{harness}{' --quick' if harness in ('gpu_test', 'bench') else ''} --out results"
    if not kit.parts:
        console.print(f"wrote {kit.path}: {wheels} wheels, {kit.size / MIB:.1f} MiB; on the "
                      f"box: sh {kit.path}/run {example}")
        return 0
    for folder, size in kit.parts:
        console.print(f"wrote {folder}: {size / MIB:.1f} MiB")
    console.print(f"{kit.path} in {len(kit.parts)} parts: {wheels} wheels, "
                  f"{kit.size / MIB:.1f} MiB; copy every part to one folder on the box, then: "
                  f"sh {kit.parts[-1][0]}/run {example}")
    return 0


def requirements_args(p: argparse.ArgumentParser) -> None:
    from sm120fork.kit.build import HARNESSES

    p.add_argument("--harness", required=True, choices=HARNESSES,
                   help="the harness the requirements are for (tune: the bench's)")
    p.add_argument("harness_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                   help="the harness's own arguments; only --stack is read")


def run_requirements(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    """Print what the GPU sessions install beside the toolkit, one requirement a line."""
    from sm120fork.kit.build import stack_requirements

    inner = argparse.ArgumentParser(add_help=False)
    inner.add_argument("--stack")
    known, _ = inner.parse_known_args([a for a in args.harness_args if a != "--"])
    harness = "bench" if args.harness == "tune" else args.harness
    for line in stack_requirements(ws.root, known.stack, harness):
        print(line)
    return 0
