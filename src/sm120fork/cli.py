"""Command line: ``python -m sm120fork <verb>``.  The only place that prints or exits."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from sm120fork import __version__
from sm120fork.errors import ToolkitError
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")
Handler = Callable[[argparse.Namespace, Workspace, Console], int]
_COMMANDS: dict[str, tuple[Handler, Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help_text: str,
            args: Callable[[argparse.ArgumentParser], None]) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = (fn, args, help_text)
        return fn
    return register


def _download_progress(console: Console) -> Callable[[str], Callable[[int, int | None], None]]:
    def factory(label: str) -> Callable[[int, int | None], None]:
        state: dict[str, object] = {}

        def update(done: int, total: int | None) -> None:
            if "progress" not in state:
                progress = Progress(TextColumn(f"downloading {label}"), BarColumn(),
                                    DownloadColumn(), TransferSpeedColumn(),
                                    console=console, transient=True)
                progress.start()
                state["progress"] = progress
                state["task"] = progress.add_task(label, total=total)
            progress_obj = state["progress"]
            assert isinstance(progress_obj, Progress)
            task = state["task"]
            assert isinstance(task, int)
            progress_obj.update(TaskID(task), completed=done)
            if total is not None and done >= total:
                progress_obj.stop()
        return update
    return factory


def _build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help="stack to build (default: the default stack)")
    p.add_argument("--force", action="store_true",
                   help="discard local work in fork trees (never done without it)")
    p.add_argument("--rebuild", action="store_true", help="ignore the build cache")
    p.add_argument("--lock-timeout", type=float, default=-1, metavar="S",
                   help="seconds to wait for another run's lock (default: wait)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="publish into DIR instead of wheels/ (e.g. a non-default stack)")


@command("build", "patched wheels of a stack into wheels/", _build_args)
def _build(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.pipeline import build_stack

    stack = ws.stack(args.stack)
    start = time.monotonic()
    builds = build_stack(ws, stack, force=args.force, rebuild=args.rebuild,
                         progress=_download_progress(console), lock_timeout=args.lock_timeout,
                         out=args.out)
    table = Table(title=f"stack {stack.name} -> {args.out or ws.wheels_dir}")
    for col in ("project", "upstream", "patches", "wheel", "sha256", "build"):
        table.add_column(col, overflow="fold")
    for b in builds:
        table.add_row(b.project, b.upstream_version, str(len(b.entry["patches"])), b.wheel.name,
                      b.sha256[:12], "cached" if b.cached else f"{b.seconds:.1f}s")
    console.print(table)
    out = args.out or Path("wheels")
    console.print(f"done in {time.monotonic() - start:.2f}s; install with: "
                  f"pip install -c {out}/constraints.txt {out}/*.whl")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sm120fork", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--root", type=Path, help="toolkit checkout (default: search upward)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("doctor", help="check this box for the fused all-reduce on SM12x "
                   "(no checkout, index or nvcc needed; --json)")
    for name, (_, add_args, help_text) in _COMMANDS.items():
        add_args(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _load_commands() -> None:
    """Import modules that register further commands."""
    import importlib

    for module in ("sm120fork.cli_maintain", "sm120fork.cli_verify"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["doctor"]:
        # The doctor runs on the serving box, without a toolkit checkout (and ships in the
        # plugin wheel as sm120fork-doctor), so it owns its arguments and its output.
        from sm120fork.doctor import main as doctor_main

        return doctor_main(args_list[1:])
    _load_commands()
    parser = make_parser()
    args = parser.parse_args(args_list)
    console = Console(stderr=False, highlight=False)
    err_console = Console(stderr=True, highlight=False)
    handler = RichHandler(console=err_console, show_time=False, show_path=False,
                          markup=False, rich_tracebacks=False)
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if args.quiet else logging.INFO)
    log.propagate = False
    try:
        ws = Workspace(args.root.resolve()) if args.root else Workspace.find()
        fn = _COMMANDS[args.command][0]
        return fn(args, ws, console)
    except ToolkitError as exc:
        if exc.detail:
            err_console.print(exc.detail, markup=False, highlight=False, style="dim")
        err_console.print(f"error: {exc.message}", markup=False, style="bold red")
        return exc.exit_code
    except KeyboardInterrupt:
        err_console.print("interrupted; the next run recovers", style="bold red")
        return 130


if __name__ == "__main__":
    sys.exit(main())
