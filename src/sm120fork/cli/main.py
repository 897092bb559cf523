"""Command line: ``python -m sm120fork <verb>``.  The only place that prints or exits.

Every verb is listed in :data:`VERBS` with its arguments, its help and the function that
runs it; nothing registers itself by being imported.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler

from sm120fork import __version__, doctor
from sm120fork.cli import aot, build, gpu, maintain, testvariant, verify
from sm120fork.cli.usage import Parser, verbosity_options
from sm120fork.errors import EXIT_INTERRUPTED, ToolkitError, UsageError
from sm120fork.util.proc import end_children
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")
Handler = Callable[[argparse.Namespace, Workspace, Console], int]


@dataclass(frozen=True, kw_only=True)
class Verb:
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    #: Runs in a checkout (``forks/`` found) and renders through the console.
    run: Handler | None = None
    #: Runs anywhere, given the verb's own arguments (the GPU verbs).
    run_argv: Callable[[argparse.Namespace, Sequence[str]], int] | None = None
    #: Parses its own arguments and owns its output: it also ships without the toolkit
    #: (the doctor, in the plugin wheel), so it only runs as the first argument.
    own_main: Callable[[Sequence[str]], int] | None = None


VERBS: dict[str, Verb] = {
    "build": Verb(help=build.HELP, add_args=build.add_args, run=build.run),
    "status": Verb(help="every stack and patch: applies, DEP-3 upstream fields, "
                        "fingerprint upstream, shipped wheel",
                   add_args=maintain.status_args, run=maintain.run_status),
    "bump": Verb(help="re-pin a project and re-classify its patches",
                 add_args=maintain.bump_args, run=maintain.run_bump),
    "refresh": Verb(help="export the fork tree's commits back into the series",
                    add_args=maintain.refresh_args, run=maintain.run_refresh),
    "upstream-pr": Verb(help="prepare (never push) an upstream PR with evidence",
                        add_args=maintain.upstream_args, run=maintain.run_upstream_pr),
    "verify-sm120": Verb(help=verify.HELP, add_args=verify.add_args, run=verify.run),
    "build-test-variant": Verb(help=testvariant.HELP, add_args=testvariant.add_args,
                               run=testvariant.run),
    "gpu": Verb(help=gpu.HELP, add_args=gpu.add_args, run_argv=gpu.run),
    "build-aot": Verb(help=aot.BUILD_HELP, add_args=aot.build_args, run=aot.run_build),
    "aot-check": Verb(help=aot.CHECK_HELP, add_args=aot.check_args, run_argv=aot.run_check),
    "doctor": Verb(help="check this box for the fused all-reduce on SM12x (no checkout, "
                        "index or nvcc needed; --json)",
                   add_args=lambda p: None, own_main=doctor.main),
}


def make_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m sm120fork",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--root", type=Path, help="toolkit checkout (default: search upward)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also every git command the toolkit runs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verbosity = [verbosity_options()]
    for name, verb in VERBS.items():
        own = verb.own_main is not None
        verb.add_args(sub.add_parser(name, help=verb.help, description=verb.help,
                                     add_help=not own, parents=verbosity if not own else []))
    return parser


def _verb_argv(argv: Sequence[str], verb: str) -> list[str]:
    """The arguments after ``verb`` (the only global option taking a value is --root)."""
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
        elif token == "--root":
            skip = True
        elif token == verb:
            return list(argv[i + 1:])
    return []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = VERBS[argv[0]].own_main if argv and argv[0] in VERBS else None
    if own is not None:
        return own(argv[1:])
    console = Console(stderr=False, highlight=False)
    err_console = Console(stderr=True, highlight=False)
    parser = make_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and VERBS[args.command].own_main is None:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except UsageError as exc:
        err_console.print(f"error: {exc.message}", markup=False, style="bold red")
        return exc.exit_code
    handler = RichHandler(console=err_console, show_time=False, show_path=False,
                          markup=False, rich_tracebacks=False)
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if args.quiet else
                 logging.DEBUG if args.verbose else logging.INFO)
    log.propagate = False
    verb = VERBS[args.command]
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigterm) if main_thread else None
    try:
        if verb.own_main is not None:
            return verb.own_main(_verb_argv(argv, args.command))
        if verb.run_argv is not None:
            return verb.run_argv(args, _verb_argv(argv, args.command))
        assert verb.run is not None
        ws = Workspace(args.root.resolve()) if args.root else Workspace.find()
        legacy = ws.adopt_legacy_trees()
        if legacy is not None:
            log.info("moved the fork trees from %s to %s (local work kept)",
                     legacy.relative_to(ws.root), ws.trees_dir.relative_to(ws.root))
        return verb.run(args, ws, console)
    except ToolkitError as exc:
        if exc.detail:
            err_console.print(exc.detail, markup=False, highlight=False, style="dim")
        err_console.print(f"error: {exc.message}", markup=False, style="bold red")
        return exc.exit_code
    except KeyboardInterrupt:
        ended = end_children()
        err_console.print(f"interrupted: {args.command} stopped"
                          + (f", {ended} running command(s) ended" if ended else "")
                          + "; its temporary folders are removed (the next run removes "
                            "any a hard kill leaves)", style="bold red", soft_wrap=True)
        return EXIT_INTERRUPTED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _sigterm(signum: int, _frame: object) -> None:
    """SIGTERM (nox forwards it alone, after 0.3 s of SIGINT) unwinds like Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
