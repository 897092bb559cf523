"""Command line: ``python -m sm120fork <verb>``.  The only place that prints or exits."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120fork import __version__
from sm120fork.entry import Parser, boundary
from sm120fork.util.files import remove_own_scratch
from sm120fork.util.proc import end_children

log = logging.getLogger("sm120fork")


def load(ref: str) -> Callable[..., int]:
    """``module:function`` under sm120fork, imported only now: the doctor, GPU verbs and
    tune need neither GitPython nor rich."""
    module, _, name = ref.partition(":")
    handler: Callable[..., int] = getattr(importlib.import_module(f"sm120fork.{module}"), name)
    return handler


@dataclass(frozen=True, kw_only=True)
class Verb:
    help: str
    #: ``run(args, ws, console)`` in a checkout, else ``run(args, argv)`` anywhere.
    run: str
    #: What adds its arguments (default: the function of cli/args.py named after the verb);
    #: standard library only: the noxfile's preflight parses with it before installing.
    args: str = ""
    checkout: bool = True
    #: ``main(argv)`` parses and prints itself (the doctor ships without the toolkit).
    own_main: bool = False


VERBS: dict[str, Verb] = {
    "build": Verb(help="patched wheels of a stack into wheels/<stack>/", run="cli.build:run"),
    "index": Verb(help="every stack's built wheels as a static package index with a landing "
                       "page of pip lines -> wheels/index/", run="cli.build:run_index"),
    "status": Verb(help="every stack and patch: applies, DEP-3 upstream fields, "
                        "fingerprint upstream, shipped wheel", run="cli.maintain:run_status"),
    "bump": Verb(help="re-pin a project and re-classify its patches", run="cli.maintain:run_bump"),
    "refresh": Verb(help="export the fork tree's commits back into the series",
                    run="cli.maintain:run_refresh"),
    "upstream-pr": Verb(help="prepare (never push) an upstream PR with evidence",
                        run="cli.maintain:run_upstream_pr"),
    "watch": Verb(help="each upstream release newer than the pins, bumped in a scratch copy: "
                       "per patch applies / merges / conflicts / upstream has it, the pins it "
                       "moves, the claims to re-make -> reports/watch/",
                  run="cli.maintain:run_watch"),
    "verify-sm120": Verb(help="check every patch's evidence (compile proof for SM12x, "
                              "behaviour checks) -> reports/<stack>/verify-sm120/",
                         run="cli.verify:run"),
    "build-test-variant": Verb(help="build a test-only variant (series + <series>-test/) "
                                    "under .forks/test-variants/ for the GPU harness; never "
                                    "published", run="cli.build:run_test_variant"),
    "record": Verb(help="evidence records: import DIR validates each record.json under DIR "
                         "and publishes it to reports/<stack>/<kind>/",
                   run="cli.verify:run_record"),
    "gpu": Verb(help="multi-rank correctness (A/B) and latency on this machine's GPUs",
                run="gpu.cli:run", args="gpu.cli:add_args", checkout=False),
    "gpu-kit": Verb(help="one folder that runs the GPU harnesses on a box with no network "
                         "(the stack's wheels, upstream's, their dependencies, the toolkit)",
                    run="cli.kit:run"),
    "gpu-requirements": Verb(help="what the GPU sessions install beside the toolkit: the "
                                  "stack's FlashInfer (and SGLang) requirements, less torch",
                             run="cli.kit:run_requirements"),
    "build-aot": Verb(help="prebuilt trtllm comm module of a stack's FlashInfer as a wheel "
                           "(needs nvcc)", run="cli.aot:run_build"),
    "aot-check": Verb(help="check an AOT wheel: which module the installed FlashInfer loads "
                           "from where, and its SASS per target",
                      run="cli.aot:run_check", checkout=False),
    "tune": Verb(help="measure this box's all-reduce methods at every TP size it can run and "
                      "install the policy SGLang follows (--yes to replace one)",
                 run="tune.cli:run", args="tune.cli:add_args", checkout=False),
    "doctor": Verb(help="check this box for the fused all-reduce on SM12x (no checkout, "
                        "index or nvcc needed; --json)", run="doctor:main", checkout=False,
                   own_main=True),
}


def _verbosity(parser: argparse.ArgumentParser, default: object = False) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", default=default,
                        help="only warnings and errors")
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="also every git command the toolkit runs")


def make_parser(verbs: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Only the verbs in ``verbs`` (default: all) get their arguments (and imports)."""
    parser = Parser(prog="python -m sm120fork",
                    description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--root", type=Path, help="toolkit checkout (default: search upward)")
    _verbosity(parser)
    after_verb = Parser(add_help=False)  # ``nox -s build -- -q`` passes them after the verb
    _verbosity(after_verb, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, verb in VERBS.items():
        p = sub.add_parser(name, help=verb.help, description=verb.help, add_help=not verb.own_main,
                           parents=[] if verb.own_main else [after_verb])
        if not verb.own_main and (verbs is None or name in verbs):
            load(verb.args or f"cli.args:{name.replace('-', '_')}")(p)
    return parser


def _verb_at(argv: Sequence[str]) -> int | None:
    """(--root is the only global option taking a value.)"""
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
        elif token == "--root":
            skip = True
        elif not token.startswith("-"):
            return i if token in VERBS else None
    return None


def _verb_argv(argv: Sequence[str]) -> list[str]:
    at = _verb_at(argv)
    return [] if at is None else list(argv[at + 1:])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    at = _verb_at(argv)
    name = None if at is None else argv[at]
    verb = VERBS.get(name) if name else None
    if verb is not None and verb.own_main:
        # Runs before rich is imported: the doctor runs where the toolkit's deps are not.
        return load(verb.run)(_verb_argv(argv))
    state = _Run()
    return boundary(lambda: _run(argv, name, state), name=name or "sm120fork",
                    root=lambda: state.root, on_interrupt=end_children,
                    cleanup=state.remove_scratch)


@dataclass
class _Run:
    root: Path | None = None

    def remove_scratch(self) -> list[str]:
        """This run's scratch an interrupted worker thread may not reach; what remains."""
        forks = [] if self.root is None else [self.root / ".forks"]
        return [str(p) for p in remove_own_scratch([Path(tempfile.gettempdir()), *forks])]


def _run(argv: list[str], name: str | None, state: _Run) -> int:
    parser = make_parser([name] if name else [])
    args = parser.parse_args(argv)
    verb = VERBS[args.command]
    run = load(verb.run)
    from rich.console import Console

    from sm120fork.cli.output import LineHandler

    console = Console(stderr=False, highlight=False)
    err_console = Console(stderr=True, highlight=False)
    log.handlers[:] = [LineHandler(err_console)]
    log.setLevel(logging.WARNING if args.quiet else
                 logging.DEBUG if args.verbose else logging.INFO)
    log.propagate = False
    if not verb.checkout:
        return run(args, _verb_argv(argv))
    from sm120fork.workspace import Workspace

    ws = Workspace(args.root.resolve()) if args.root else Workspace.find()
    state.root = ws.root
    return run(args, ws, console)


if __name__ == "__main__":
    sys.exit(main())
