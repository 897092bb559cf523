"""``python -m sm120fork.gpu VERB`` (``python -m sm120fork gpu VERB``): the GPU verbs, for a
GPU machine with torch (and nvcc for FlashInfer's JIT) but no nox and no package index."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sm120fork.entry import Parser, boundary
from sm120fork.errors import UsageError, VerifyError
from sm120fork.gpu import methods, upstream_tests
from sm120fork.gpu.ab import run as ab_run
from sm120fork.gpu.bench import run as bench_run
from sm120fork.gpu.core import cases as cases_mod
from sm120fork.gpu.core import records, safety
from sm120fork.gpu.core import runs as core_runs
from sm120fork.gpu.core.documents import Provenance
from sm120fork.gpu.core.safety import ALLOW_MULTICAST_FLAG, check_backend
from sm120fork.gpu.layer import run as layer_run
from sm120fork.layouts import LAYOUTS
from sm120fork.util import proc

if TYPE_CHECKING:  # imported when --stack is given: a GPU box has no checkout's stages
    from sm120fork.resolved import ResolvedStack


def counts(text: str) -> list[int]:
    """An argparse type: comma-separated integers (``1,16,128``)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text}") from exc


def sizes(text: str, refusal: str = "world sizes must be >= 2") -> list[int]:
    """An argparse type: world (or TP) sizes, each at least 2."""
    values = counts(text)
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError(refusal)
    return values


def add_args(parser: argparse.ArgumentParser) -> None:
    """Add the GPU verbs to ``parser``, each with the function that runs it (``handler``)."""
    sub = parser.add_subparsers(dest="gpu_command", required=True, metavar="COMMAND")
    _test_args(sub.add_parser("test", help="correctness matrix (A/B over variants)"))
    _bench_args(sub.add_parser("bench", help="every all-reduce + RMSNorm method, checked then "
                               "timed, side by side; writes the policy"))
    _layer_args(sub.add_parser("sglang-layer", help="SGLang's fused-norm layer path, fused and "
                               "under injected workspace faults (ranks share the GPUs)"))
    u = sub.add_parser("upstream-tests", help="an upstream PR's own GPU tests (pytest) on "
                       "the patched and upstream FlashInfer; one upstream-pr record per PR")
    upstream_tests.add_args(u)
    u.set_defaults(handler=upstream_tests.run)
    j = sub.add_parser("project", help="PROJECTION (not a measurement) of the methods on an "
                       "8x RTX PRO 6000 PCIe box from the facts file's figures")
    j.add_argument("--out", type=Path, required=True)
    j.set_defaults(handler=cmd_project)
    r = sub.add_parser("report", help="re-render reports from their JSON")
    r.add_argument("--test", type=Path)
    r.add_argument("--bench", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.set_defaults(handler=cmd_report)


def _common(p: argparse.ArgumentParser) -> None:
    """What ``test`` and ``bench`` share: the variants, the run's folders, the bounds."""
    core_runs.variant_args(p)
    p.add_argument("--stack", metavar="NAME",
                   help="the stack's built wheels (wheels/NAME/) as 'patched'; for "
                   "test also upstream's, built from the stack's pinned sdist "
                   "(sha256-checked, cached) as 'unpatched'")
    p.add_argument("--quick", action="store_true", help="the quick subset")
    p.add_argument("--out", type=Path, help="the run's folder: its report, logs and "
                   "record (default gpu-runs/<gpu>-<count>x; nox -s record_import -- "
                   "DIR publishes the record into reports/)")
    p.add_argument("--backend", default="trtllm",
                   help='workspace backend for the unified API (only "trtllm" unless '
                   f"{ALLOW_MULTICAST_FLAG})")
    p.add_argument(ALLOW_MULTICAST_FLAG, dest="allow_multicast", action="store_true",
                   help="this machine is yours and supports CUDA multicast")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--case-timeout", type=float, default=90.0,
                   help="watchdog: seconds without rank output before a case is ended")
    p.add_argument("--compile-timeout", type=float, default=1200.0)
    p.add_argument("--not-run", action="append", default=[],
                   help="a line for the report's 'Not run here' section")
    p.add_argument("--tokens", type=counts, help="only these token counts, e.g. 1,16")
    p.add_argument("--hidden", type=counts, help="these hidden sizes, e.g. 4096,7168 (test: "
                   "every selected case at each instead of its own)")


def _test_args(t: argparse.ArgumentParser) -> None:
    _common(t)
    t.set_defaults(handler=cmd_run)
    t.add_argument("--world-sizes", type=sizes,
                   help="default: 2, 4 and 8 up to the GPU count, at least 2")
    t.add_argument("--api", action="append", dest="apis", choices=cases_mod.APIS)
    t.add_argument("--pattern", action="append", dest="patterns",
                   choices=list(cases_mod.PATTERN_CODES))
    t.add_argument("--title", help="what this run is, before the GPU in the report's title "
                   "(e.g. 'cluster answer forced to 8')")
    t.add_argument("--max-cases", type=int)
    t.add_argument("--primary", help="the variant under test (default: patched, else first)")


def _bench_args(b: argparse.ArgumentParser) -> None:
    _common(b)
    b.set_defaults(handler=cmd_run)
    b.add_argument("--world-sizes", "--world-size", dest="world_sizes", type=sizes,
                   help="default: the GPU count, at least 2")
    b.add_argument("--method", action="append", dest="methods", choices=list(methods.METHODS),
                   help="only these methods (default: every one)")


def _layer_args(s: argparse.ArgumentParser) -> None:
    s.set_defaults(handler=cmd_sglang_layer)
    s.add_argument("--sglang-path", type=Path,
                   help="the directory holding the sglang package under test (python/)")
    s.add_argument("--stack", metavar="NAME",
                   help="instead of --sglang-path: the stack's built SGLang (for this Python) "
                   "and FlashInfer wheels (wheels/NAME/), unpacked under --work-dir; the "
                   "report records their sha256")
    s.add_argument("--stack-dir", type=Path, metavar="DIR",
                   help="as --stack, from a stack's wheels folder elsewhere (a kit's stack/)")
    s.add_argument("--work-dir", type=Path, default=core_runs.DEFAULT_WORK_DIR,
                   help="where --stack unpacks the wheels (kept between runs)")
    s.add_argument("--layout", choices=tuple(LAYOUTS),
                   help="the tree's upstream layout (default: the one forks/<stack>.toml "
                   "names for the tree's SGLang version)")
    s.add_argument("--case", action="append", dest="cases", choices=layer_run.CPU_CASES,
                   help="default: every case this device can run")
    s.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    s.add_argument("--world-size", type=int, default=2)
    s.add_argument("--tokens", type=counts)
    s.add_argument("--load-plugins", action="store_true",
                   help="each rank runs SGLang's load_plugins() first, as SGLang's own "
                   "processes do (stock SGLang + a plugin installed beside it)")
    s.add_argument("--with-plugin-route", action="store_true",
                   help="with --stack/--stack-dir: also run every case on stock SGLang of the "
                   "pin with the stack's plugin wheel beside it (load_plugins() in each "
                   "rank), in the same record as variant 'plugin'")
    s.add_argument("--plugin-wheel", type=Path, metavar="WHL",
                   help="the plugin route's plugin wheel (default: the stack's plugin/)")
    s.add_argument("--stock-wheel", type=Path, metavar="WHL",
                   help="the plugin route's stock SGLang wheel (default in a kit: "
                   "kit.json's plugin_route)")
    s.add_argument("--time-budget", type=float, metavar="S",
                   help="no case starts after S seconds from the start (the JIT build "
                   "included); the cases left are listed as not run, the record unfinished")
    s.add_argument("--jobs", type=int, default=1,
                   help="cases run at once, each in its own ranks (default 1)")
    s.add_argument("--prebuild", action="store_true",
                   help="build FlashInfer's comm and pcie_ipc modules once before the "
                   "cases, in parallel (on a GPU)")
    s.add_argument("--note", action="append", dest="notes", metavar="NOTE", default=[])
    s.add_argument("--out", type=Path, required=True)


_Opts = TypeVar("_Opts", bound=core_runs.RunOptions | layer_run.LayerOptions)


def _options(cls: type[_Opts], args: argparse.Namespace, argv: Sequence[str], **more: Any
             ) -> _Opts:
    """A verb's options: each field of ``cls`` from the argument of its name (a list as a
    tuple), the command lines, and ``more``."""
    given = {f.name: tuple(v) if isinstance(v := getattr(args, f.name), list) else v
             for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, "command": shlex.join(["python", "-m", "sm120fork.gpu", *argv]),
                  "record_command": records.recorded_command(args.gpu_command, argv), **more})


def resolved_stack(name: str | None) -> ResolvedStack | None:
    """``--stack NAME``, resolved once where the command starts (after :func:`ready`)."""
    if name is None:
        return None
    from sm120fork.resolved import ResolvedStack
    from sm120fork.workspace import Workspace

    return ResolvedStack.named(Workspace.find(), name)


def cmd_run(args: argparse.Namespace, argv: Sequence[str],
            host: safety.GpuHost | None) -> int:
    """``test`` or ``bench``; the run's own failure (cases failing, nothing run) goes to the
    one error boundary."""
    wheels = {"wheel_dirs": core_runs.parse_variant_specs(args.wheel_dir),
              "prebuilt": core_runs.parse_variant_specs(args.prebuilt),
              "stack": resolved_stack(args.stack)}
    done: ab_run.TestRun | bench_run.BenchRun
    if args.gpu_command == "test":
        done = ab_run.run_test(_options(ab_run.TestOptions, args, argv, **wheels))
    else:
        done = bench_run.run_bench(_options(bench_run.BenchOptions, args, argv, **wheels))
    logs = f" and {done.logs}" if isinstance(done, ab_run.TestRun) else ""
    print(f"wrote {', '.join(map(str, done.paths))}{logs}")
    print("\n".join(done.headline()))
    if (error := done.error()) is not None:
        raise error
    return 0


def cmd_project(args: argparse.Namespace, argv: Sequence[str],
                host: safety.GpuHost | None) -> int:
    from sm120fork.gpu.bench import projection

    written = projection.write(projection.table(), args.out)
    print(f"wrote {', '.join(map(str, written))} ({projection.LABEL})")
    return 0


def cmd_report(args: argparse.Namespace, argv: Sequence[str],
               host: safety.GpuHost | None) -> int:
    written = [*(ab_run.rerender(args.test, args.out) if args.test else []),
               *(bench_run.rerender(args.bench, args.out) if args.bench else [])]
    if not written:
        raise UsageError("nothing to render", fix="pass --test and/or --bench")
    print(f"wrote {', '.join(map(str, written))}")
    return 0


def cmd_sglang_layer(args: argparse.Namespace, argv: Sequence[str],
                     host: safety.GpuHost | None) -> int:
    from sm120fork.gpu.core import stack_wheels

    folder, tested = args.stack_dir, records.tested_beside(args.stack_dir)
    if (resolved := resolved_stack(args.stack)) is not None:
        folder, tested = resolved.folder, resolved.tested()
    site: tuple[Path, ...] = ()
    made: Provenance | None = None
    if folder is not None:
        trees = stack_wheels.layer_trees(folder, args.work_dir)
        args.sglang_path, site, made = trees.sglang_path, trees.site, trees.made
    routes: tuple[layer_run.LayerRoute, ...] = ()
    if args.with_plugin_route:
        if folder is None or made is None:
            raise UsageError("--with-plugin-route needs --stack or --stack-dir",
                             where="sglang-layer")
        plugin_whl, stock_whl = stack_wheels.plugin_route_wheels(folder, args.plugin_wheel,
                                                                 args.stock_wheel)
        stock, plugin, rows = stack_wheels.plugin_trees(stock_whl, plugin_whl, args.work_dir,
                                                        made["stack"] or "stack")
        # the stack's FlashInfer (``site``) serves both routes: one JIT build for both
        routes = (layer_run.LayerRoute(variant="plugin", sglang_path=stock,
                                       site=(plugin, *site), made_from=tuple(rows)),)
    opts = _options(
        layer_run.LayerOptions, args, argv,
        layout=args.layout or layer_run.layout_of(args.sglang_path), site=site, made=made,
        tested=tested, routes=routes,
        machine={"gpus": list(host.gpus), "torch": host.torch, "cuda": host.cuda}
        if host else {})
    outcomes = layer_run.run_sglang_layer(opts)
    failed = [o for o in outcomes if not o.passed]
    # a run cut short (its time budget) is not a pass: its record is unfinished
    cut_short = len(outcomes) < len(layer_run.planned_cases(opts))
    return VerifyError.exit_code if failed or cut_short else 0


def ready(args: argparse.Namespace) -> safety.GpuHost | None:
    """Refuse what cannot run here before anything is resolved, installed or built: a
    multicast backend on a shared host, then a box whose Python has no CUDA torch or GPU."""
    if args.gpu_command in ("test", "bench"):
        check_backend(args.backend, allow_multicast=args.allow_multicast,
                      host_environ=os.environ)
    if args.gpu_command == "sglang-layer" and sum(
            x is not None for x in (args.stack, args.stack_dir, args.sglang_path)) != 1:
        raise UsageError("give one of --stack, --stack-dir, --sglang-path",
                         where="sglang-layer",
                         fix="e.g. --stack sglang-0.5.23 on a checkout with that build")
    if args.gpu_command in ("test", "bench") or (
            args.gpu_command == "sglang-layer" and args.device == "cuda") or (
            args.gpu_command == "upstream-tests" and args.compile):
        return safety.require_gpu()
    return None


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the parsed GPU verb; ``argv`` (from the verb on) is recorded in the reports."""
    host = ready(args)
    handler: Callable[[argparse.Namespace, Sequence[str], safety.GpuHost | None], int] = (
        args.handler)
    return handler(args, argv, host)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sm120fork.gpu``: needs neither rich nor a checkout's forks/."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    parser = Parser(prog="python -m sm120fork.gpu", description=__doc__)
    add_args(parser)
    return boundary(lambda: run(parser.parse_args(argv), argv),
                    name="python -m sm120fork.gpu", root=Path.cwd,
                    on_interrupt=proc.end_children)
