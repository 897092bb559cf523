"""Command line: ``python -m sm120fork <verb>``.  The only place that prints or exits.

Every verb is listed in :data:`VERBS` with its help and the module that runs it; nothing
registers itself by being imported, and a verb's module is imported only when that verb
runs (or shows its help), so ``doctor`` needs neither GitPython nor rich.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from sm120fork import __version__
from sm120fork.cli.usage import verbosity_options
from sm120fork.entry import Parser, boundary

log = logging.getLogger("sm120fork")


@dataclass(frozen=True, kw_only=True)
class Verb:
    help: str
    #: The module that runs the verb (imported only for this verb).
    module: str
    #: ``module:function`` that adds the verb's arguments, default :mod:`sm120fork.cli.args`'s
    #: function named after the verb.  The standard library alone imports it: the noxfile's
    #: preflight parses a session's arguments with it before anything is installed.
    args: str | None = None
    #: Runs in a checkout (``forks/`` found): ``run(args, ws, console) -> int``.
    run: str | None = None
    #: Runs anywhere, given the verb's own arguments: ``run(args, argv) -> int``.
    run_argv: str | None = None
    #: Parses its own arguments and owns its output (``main(argv) -> int``): it also ships
    #: without the toolkit (the doctor, in the plugin wheel).
    own_main: str | None = None

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def function(self, name: str) -> Callable[..., Any]:
        fn: Callable[..., Any] = getattr(self.load(), name)
        return fn

    def add_args(self, name: str, parser: argparse.ArgumentParser) -> None:
        """Add verb ``name``'s arguments to ``parser``."""
        where = self.args or f"sm120fork.cli.args:{name.replace('-', '_')}"
        module, _, function = where.partition(":")
        getattr(importlib.import_module(module), function)(parser)


VERBS: dict[str, Verb] = {
    "build": Verb(help="patched wheels of a stack into wheels/<stack>/",
                  module="sm120fork.cli.build", run="run"),
    "index": Verb(help="every stack's built wheels as a static package index with a landing "
                       "page of pip lines -> wheels/index/",
                  module="sm120fork.cli.index", run="run"),
    "status": Verb(help="every stack and patch: applies, DEP-3 upstream fields, "
                        "fingerprint upstream, shipped wheel",
                   module="sm120fork.cli.maintain", run="run_status"),
    "bump": Verb(help="re-pin a project and re-classify its patches",
                 module="sm120fork.cli.maintain", run="run_bump"),
    "refresh": Verb(help="export the fork tree's commits back into the series",
                    module="sm120fork.cli.maintain", run="run_refresh"),
    "upstream-pr": Verb(help="prepare (never push) an upstream PR with evidence",
                        module="sm120fork.cli.maintain",
                        run="run_upstream_pr"),
    "watch": Verb(help="each upstream release newer than the pins, bumped in a scratch copy: "
                       "per patch applies / merges / conflicts / upstream has it, the pins it "
                       "moves, the claims to re-make -> reports/watch/",
                  module="sm120fork.cli.maintain", run="run_watch"),
    "verify-sm120": Verb(help="check every patch's evidence (compile proof for SM12x, "
                              "behaviour checks) -> reports/<stack>/verify-sm120/",
                         module="sm120fork.cli.verify", run="run"),
    "build-test-variant": Verb(help="build a test-only variant (series + <series>-test/) "
                                    "under .forks/test-variants/ for the GPU harness; never "
                                    "published",
                               module="sm120fork.cli.testvariant", run="run"),
    "record": Verb(help="evidence records: import DIR validates each record.json under DIR "
                         "and publishes it to reports/<stack>/<kind>/",
                   module="sm120fork.cli.record", run="run"),
    "gpu": Verb(help="multi-rank correctness (A/B) and latency on this machine's GPUs",
                module="sm120fork.gpu.cli", args="sm120fork.gpu.cli:add_args",
                run_argv="run"),
    "gpu-kit": Verb(help="one folder that runs the GPU harnesses on a box with no network "
                         "(the stack's wheels, upstream's, their dependencies, the toolkit)",
                    module="sm120fork.cli.kit", run="run"),
    "gpu-requirements": Verb(help="what the GPU sessions install beside the toolkit: the "
                                  "stack's FlashInfer (and SGLang) requirements, less torch",
                             module="sm120fork.cli.kit",
                             run="run_requirements"),
    "build-aot": Verb(help="prebuilt trtllm comm module of a stack's FlashInfer as a wheel "
                           "(needs nvcc)",
                      module="sm120fork.cli.aot", run="run_build"),
    "aot-check": Verb(help="check an AOT wheel: which module the installed FlashInfer loads "
                           "from where, and its SASS per target",
                      module="sm120fork.cli.aot", run_argv="run_check"),
    "tune": Verb(help="measure this box's all-reduce methods at every TP size it can run and "
                      "install the policy SGLang follows (--yes to replace one)",
                 module="sm120fork.tune.cli", args="sm120fork.tune.cli:add_args",
                 run_argv="run"),
    "doctor": Verb(help="check this box for the fused all-reduce on SM12x (no checkout, "
                        "index or nvcc needed; --json)",
                   module="sm120fork.doctor", own_main="main"),
}


def make_parser(verbs: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the verbs in ``verbs`` (default: all) get their arguments, so
    only their modules are imported."""
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
        p = sub.add_parser(name, help=verb.help, description=verb.help, add_help=not own,
                           parents=verbosity if not own else [])
        if not own and (verbs is None or name in verbs):
            verb.add_args(name, p)
    return parser


def _verb_name(argv: Sequence[str]) -> str | None:
    """The verb ``argv`` names (the only global option taking a value is --root)."""
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == "--root":
            skip = True
        elif token in VERBS:
            return token
        elif not token.startswith("-"):
            return None
    return None


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
    name = _verb_name(argv)
    verb = VERBS.get(name) if name else None
    if verb is not None and verb.own_main is not None and argv[0] == name:
        # Runs before rich is imported: the doctor runs where the toolkit's deps are not.
        own_main = verb.function(verb.own_main)
        return int(own_main(argv[1:]))
    state = _Run()
    return boundary(lambda: _run(argv, state), name=name or "sm120fork",
                    root=lambda: state.root, on_interrupt=_end_children,
                    cleanup=lambda: _remove_scratch(state.root))


@dataclass
class _Run:
    """What the error boundary learns of a run: the checkout, once the workspace is
    found (its hints and scratch folders are relative to it)."""

    root: Path | None = None


def _end_children() -> int:
    from sm120fork.util.proc import end_children

    return end_children()


def _remove_scratch(root: Path | None) -> list[str]:
    """Remove this run's scratch folders (temp directory, the checkout's .forks/), which
    an interrupted worker thread may not reach; return those that remain."""
    import tempfile

    from sm120fork.util.files import remove_own_scratch

    parents = [Path(tempfile.gettempdir())]
    if root is not None:
        parents.append(root / ".forks")
    return [str(p) for p in remove_own_scratch(parents)]


def _run(argv: list[str], state: _Run) -> int:
    parser = make_parser([n] if (n := _verb_name(argv)) else [])
    args, extra = parser.parse_known_args(argv)
    verb = VERBS[args.command]
    if extra and verb.own_main is None:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if verb.own_main is not None:
        return int(verb.function(verb.own_main)(_verb_argv(argv, args.command)))
    from rich.console import Console

    from sm120fork.cli.logs import LineHandler

    console = Console(stderr=False, highlight=False)
    err_console = Console(stderr=True, highlight=False)
    log.handlers[:] = [LineHandler(err_console)]
    log.setLevel(logging.WARNING if args.quiet else
                 logging.DEBUG if args.verbose else logging.INFO)
    log.propagate = False
    if verb.run_argv is not None:
        return int(verb.function(verb.run_argv)(args, _verb_argv(argv, args.command)))
    assert verb.run is not None
    from sm120fork.workspace import Workspace

    ws = Workspace(args.root.resolve()) if args.root else Workspace.find()
    state.root = ws.root
    return int(verb.function(verb.run)(args, ws, console))


if __name__ == "__main__":
    sys.exit(main())
