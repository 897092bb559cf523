"""``build-aot`` and ``aot-check``: the AOT wheel of a stack's trtllm comm module."""

from __future__ import annotations

import argparse
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from sm120fork.cli.output import table
from sm120fork.workspace import Workspace


def run_build(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.aot.compile import parse_capabilities
    from sm120fork.aot.pipeline import build_aot, default_out

    stack = ws.stack(args.stack)
    if args.via_cibuildwheel:
        import os

        from sm120fork.aot.pipeline import build_via_cibuildwheel

        os.environ["SM120FORK_STACK"] = stack.name
        wheel = build_via_cibuildwheel(ws.root, ws.root / "aot",
                                       args.out or default_out(ws, stack))
        console.print(f"cibuildwheel steps on this host: built, repaired and tested {wheel}")
        return 0
    result = build_aot(ws, stack,
                       capabilities=parse_capabilities(args.capabilities.split(",")),
                       wheels_dir=args.wheels_dir, out=args.out, jobs=args.jobs,
                       rebuild=args.rebuild, platform=args.platform)
    rows = table(result.wheel.name,
                 ("target", "kernels", "SASS bytes", "vs sm_90a", "compile s (device passes)"))
    per_target = result.compiled.seconds_per_target()
    checks = {c.target: c for c in result.checks}
    for code in result.code:
        check = checks.get(code.target)
        verdict = ("reference" if check is None else
                   f"{check.present}/{check.reference_kernels} present, {len(check.empty)} empty")
        seconds = next((v for k, v in per_target.items() if k.startswith(code.target)), None)
        rows.add_row(code.target, str(len(code.kernels)), str(sum(code.kernels.values())),
                     verdict, "-" if seconds is None else f"{seconds:.0f}")
    console.print(rows)
    state = "cached" if result.compiled.cached else f"{result.compiled.wall_seconds:.0f} s"
    console.print(f"compile: {state}; wheel: {result.wheel}")
    return 0


def run_check(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Runs anywhere (cibuildwheel's test step, the GPU machine): no checkout needed."""
    import tempfile

    from sm120fork.aot import check
    from sm120fork.aot.wheel import PACKAGE, read_wheel
    from sm120fork.errors import VerifyError

    console = Console(highlight=False)
    manifest = read_wheel(args.wheel)
    findings: dict[str, object] = {"wheel": args.wheel.name, "version": manifest.version,
                                   "flashinfer": manifest.flashinfer.version}
    problems: list[str] = []
    if not args.no_lookup:
        with tempfile.TemporaryDirectory(prefix="sm120fork-aot-check-") as tmp:
            found = check.lookup(env={"FLASHINFER_WORKSPACE_BASE": tmp},
                                 specs=[*check.DEFAULT_SPECS, *args.module])
        problems += check.check_installed(manifest, found)
        findings["lookup"] = found.printed
        console.print(f"FlashInfer {found.flashinfer_version}:")
        for line in check.describe(found):
            console.print(line, markup=False)
    if args.code:
        with tempfile.TemporaryDirectory(prefix="sm120fork-aot-so-") as tmp:
            for name, entry in manifest.modules.items():
                so = Path(tmp) / f"{name}.so"
                with zipfile.ZipFile(args.wheel) as zf:
                    so.write_bytes(zf.read(f"{PACKAGE}/{entry.path}"))
                code = check.embedded_code(so)
                checks = check.check_module(code)
                findings[f"code:{name}"] = {**check.summary(code, checks),
                                            "families": check.family_rows(code)}
                problems += [f"{name} {c.target}: {len(c.missing)} kernels missing, "
                             f"{len(c.empty)} empty" for c in checks if not c.ok]
                sass = table(f"{name}: embedded SASS",
                             ("target", "cubin", "kernels", "SASS bytes", "vs sm_90a"))
                by_target = {c.target: c for c in checks}
                for c in code:
                    k = by_target.get(c.target)
                    sass.add_row(c.target, c.cubin, str(len(c.kernels)),
                                 str(sum(c.kernels.values())), "reference" if k is None else
                                 f"{k.present}/{k.reference_kernels}, {len(k.empty)} empty")
                console.print(sass)
    findings["problems"] = problems
    if args.json:
        args.json.write_text(json.dumps(findings, indent=1) + "\n")
    if problems:
        raise VerifyError("; ".join(problems), where=str(args.wheel))
    console.print(f"{args.wheel.name}: ok")
    return 0

