"""Each verb's arguments, a function named after it.  Standard library only: the noxfile's
preflight parses with these very parsers in nox's own Python, before any install."""

from __future__ import annotations

import argparse
from pathlib import Path

from sm120fork.aot.compile import DEFAULT_CAPABILITIES
from sm120fork.errors import UsageError
from sm120fork.kit.boot import DEFAULT_HARNESSES
from sm120fork.kit.boot import VERBS as HARNESSES
from sm120fork.util.hint import command

#: Below this width ``status --wide`` cannot show its seven columns: a record per patch.
WIDE_MIN_WIDTH = 160
_STACK = "stack (default: the default stack)"
_JOBS = "parallel nvcc runs (default 2)"


def _flags(p: argparse._ActionsContainer, helps: dict[str, str]) -> None:
    """Switches, each ``--name`` with its help."""
    for flag, text in helps.items():
        p.add_argument(flag, action="store_true", help=text)


def build(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--stack", help="stack to build (default: the default stack)")
    _flags(which, {"--all-stacks": "build every stack under forks/, each into wheels/<stack>/"})
    _flags(p, {
        "--force": "discard local work in fork trees (never done without it)",
        "--rebuild": "ignore the build cache",
        "--unchecked": "publish even if the patched tree fails its check (compile, import "
                       "under the fake-GPU probe); the manifest records the build unchecked"})
    p.add_argument("--lock-timeout", type=float, default=-1, metavar="S",
                   help="seconds to wait for another run's lock (default: wait)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="publish into DIR instead of wheels/<stack>/")


def index(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", metavar="URL",
                   help="where the site will be served from, as the pip lines name it "
                        "(default: the folder's file:// URL)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write the site into DIR instead of wheels/index/")


def status(p: argparse.ArgumentParser) -> None:
    p.add_argument("stack", nargs="?", help="only this stack (default: every stack)")
    _flags(p, {
        "--json": "machine-readable output",
        "--wide": "every DEP-3 field and check in its own column (a record per patch "
                  f"below {WIDE_MIN_WIDTH} columns, e.g. in a pipe)",
        "--no-fetch": "do not download the pinned upstream of a stack never built here "
                      "(its patches are then not checked)"})
    p.add_argument("--wheels", type=Path, metavar="DIR",
                   help="read the wheel column from DIR/manifest.json (see build --out)")


def bump(p: argparse.ArgumentParser) -> None:
    p.add_argument("stack", help="the stack whose pin moves (forks/STACK.toml); with "
                                 "--new-stack the one copied from; with --continue, --skip "
                                 "or --abort the stack being bumped")
    p.add_argument("project", help="the project of that stack to re-pin "
                                   "(its [projects.PROJECT] table, e.g. flashinfer)")
    p.add_argument("revision", nargs="?",
                   help="new upstream version (sdist from the index) or a 40-hex git SHA")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--continue", dest="cont", action="store_true",
                      help="resume after resolving a conflict in the fork tree")
    _flags(what, {
        "--skip": "drop the patch the bump stopped at (upstream does without it) and resume",
        "--abort": "restore the previous fork tree, pin and series exactly"})
    _flags(p, {"--allow-downgrade": "accept an older version"})
    p.add_argument("--new-stack", metavar="NAME",
                   help="copy the project (and the projects it requires, as STACK pins "
                        "them) into a new stack NAME and bump that, leaving STACK as it is")
    p.add_argument("--version", dest="pep440", metavar="V",
                   help="the PEP 440 version of a git SHA revision")
    p.add_argument("--git-commit", metavar="SHA",
                   help="the upstream commit of the new sdist when it records none")


def bump_revision(args: argparse.Namespace) -> None:
    """(argparse has no 'required unless'.)"""
    if not (args.cont or args.skip or args.abort or args.revision):
        raise UsageError("bump needs a version or a git SHA (or --continue / --abort)",
                         where=command("bump"), fix=f"see {command('bump', '--help')}")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def watch(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", action="append", default=[], metavar="NAME",
                   help="only this stack (repeatable; default: every stack in forks/)")
    p.add_argument("--limit", type=_positive, default=2, metavar="N",
                   help="bump the newest N releases of each project (default: 2); every "
                        "newer one is listed")
    _flags(p, {"--json": "the report as JSON on stdout"})


def refresh(p: argparse.ArgumentParser) -> None:
    p.add_argument("stack")
    p.add_argument("project")
    _flags(p, {"--force": "overwrite uncommitted edits of the series' patch files"})


def upstream_pr(p: argparse.ArgumentParser) -> None:
    p.add_argument("stack")
    p.add_argument("project", nargs="?",
                   help="one project of the stack (default: every project; with --pr, the "
                        "one whose series has that PR)")
    p.add_argument("--onto", metavar="REF",
                   help="rebase the branch onto REF of an upstream checkout (see --repo)")
    p.add_argument("--repo", metavar="PATH_OR_URL",
                   help="upstream repository to fetch --onto from (default: the declared "
                        "git URL)")
    _flags(p, {"--write": "with --pr: publish the PR's record (what it was tested with) to "
                          "reports/<stack>/upstream-pr/<pr>/"})
    p.add_argument("--pr", metavar="NAME",
                   help="prepare this PR (an Upstream-PR group of the series; without --pr "
                        "the PRs are listed)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="with --pr: where the package goes (default: "
                        ".forks/upstream/<stack>/<project>/<pr>/)")
    _flags(p, {
        "--no-tests": "with --pr: do not run the PR's tests (the body then says so)",
        "--even-if-failing": "with --pr: write the package although a test of the PR failed "
                             "or did not run (the body says which; refused otherwise)",
        "--requirements": "with --pr: print what the PR's tests import beyond the toolkit, "
                          "one requirement a line, and stop (nox -s upstream_pr installs "
                          "them)"})


def verify_sm120(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help=_STACK)
    p.add_argument("--jobs", type=int, default=2, help=_JOBS)
    _flags(p, {"--force": "discard local work in the fork trees it needs"})
    p.add_argument("--arch", action="append", dest="archs", metavar="ARCH",
                   help="compile-proof architectures besides sm_90a and sm_120f (repeatable; "
                        "default: sm_120a and sm_121a too)")


def build_test_variant(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help=_STACK)
    p.add_argument("--project", default="flashinfer", help="project key (default flashinfer)")
    p.add_argument("--name", required=True,
                   help="variant name, appended to the local label (e.g. f5test)")
    _flags(p, {"--force": "discard local work in the variant's fork tree"})


def record(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="record_command", required=True, metavar="ACTION")
    imp = sub.add_parser("import", help="validate each record.json under DIR and publish it "
                                        "to reports/<stack>/<kind>/")
    imp.add_argument("directory", metavar="DIR", help="the folder a run wrote its records into")


def gpu_kit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help=_STACK)
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


def gpu_requirements(p: argparse.ArgumentParser) -> None:
    p.add_argument("--harness", required=True, choices=HARNESSES,
                   help="the harness the requirements are for (tune: the bench's)")
    p.add_argument("harness_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                   help="the harness's own arguments; only --stack is read")


def build_aot(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help=_STACK)
    p.add_argument("--capabilities", default=",".join(DEFAULT_CAPABILITIES),
                   help="GPU compute capabilities to build for; FlashInfer picks each one's "
                   "target and drops those its module refuses (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=2, help=_JOBS)
    _flags(p, {"--rebuild": "ignore the compile cache"})
    p.add_argument("--wheels-dir", type=Path,
                   help="where the stack's wheels and manifest.json are (default: wheels/<stack>/)")
    p.add_argument("--out", type=Path, help="where the AOT wheel goes "
                   "(default: wheels/aot/<stack>/)")
    p.add_argument("--platform", help="wheel platform tag (default: this machine's)")
    _flags(p, {"--via-cibuildwheel": "run cibuildwheel's steps for aot/ (before-build, build, "
                                     "repair, test) on this host, as read from "
                                     "aot/pyproject.toml"})


def aot_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("wheel", type=Path, help="the AOT wheel (installed in this environment, "
                   "with the FlashInfer it pins)")
    _flags(p, {"--code": "also list the embedded SASS per target with cuobjdump and compare "
                         "every target's kernels with sm_90a"})
    p.add_argument("--module", action="append", default=[], metavar="IMPORT:FUNCTION",
                   help="also say where this module loads from: the JitSpec maker that "
                   "takes no arguments, e.g. flashinfer.jit.norm:gen_norm_module (repeatable)")
    _flags(p, {"--no-lookup": "skip asking the installed FlashInfer (the wheel alone)"})
    p.add_argument("--json", type=Path, help="write the findings here")
