"""``python -m sm120fork doctor`` and the plugin wheel's ``sm120fork-doctor``: the one
place of the doctor that prints (text, or ``--json`` on stdout) and exits."""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..entry import Parser, _nox_session, boundary
from ..errors import DoctorError, UsageError
from ..util import proc
from .facts import SCHEMA, Facts, parse_facts
from .ipc import probe as ipc_probe
from .probe import Probes, collect, flashinfer_facts, portable, sglang_decisions
from .rules import Report, judge


def render(report: Report) -> str:
    examined = report.sections.get("python")
    out = [f"doctor of {examined['path']} ({examined['why']})"] if examined else []
    for name, lines in itertools.groupby(report.lines, key=lambda line: line[0]):
        out.append(f"[{name}]")
        out += [f"  {text}" for _, text in lines]
    out.append(f"[blockers] {len(report.blockers)}")
    out += [f"  BLOCKER: {b}" for b in report.blockers]
    return "\n".join(out) + "\n"


def read_facts(path: Path) -> Facts:
    """The record in ``path``; unreadable or of another schema: a usage error."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--facts {path}: cannot read a facts file: {exc}") from exc
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA:
        raise UsageError(f"--facts {path}: schema {schema!r}, this doctor "
                         f"reads {SCHEMA!r}")
    return parse_facts(data, str(path))


def parser() -> Parser:
    p = Parser(
        prog="sm120fork-doctor",
        description="Check this box for SGLang's fused all-reduce on SM12x: GPUs, P2P, "
                    "peer writes and reads, packages, the comm module, SGLang's --tp "
                    "decisions. --record saves what it found; --facts judges a record.")
    p.add_argument("--json", action="store_true", help="one JSON object for machines")
    p.add_argument("--record", type=Path, metavar="FILE",
                   help="also write every probed fact to FILE (send it to be re-judged)")
    p.add_argument("--facts", type=Path, metavar="FILE",
                   help="judge the facts recorded in FILE instead of this box (offline)")
    p.add_argument("--tp", type=int, action="append", default=[], metavar="N",
                   help="the --tp you will serve with: a blocker unless it works (repeatable)")
    p.add_argument("--base-gpu-id", type=int, default=0, metavar="I",
                   help="SGLang's --base-gpu-id (its ranks use GPUs I..I+tp-1)")
    p.add_argument("--decide-timeout", type=float, default=300, metavar="S",
                   help="seconds for SGLang's --tp decisions (they import SGLang)")
    p.add_argument("--pair-timeout", type=float, default=30, metavar="S",
                   help="seconds each GPU pair of the peer probe may take before it is "
                        "named a hang")
    p.add_argument("--python", type=Path, metavar="PATH",
                   help="look at the environment SGLang serves from: run the doctor in that "
                        "interpreter (e.g. /srv/venv/bin/python), which needs nothing of the "
                        "toolkit installed")
    return p


#: Set by a doctor that re-runs itself in the interpreter it examines: why that one.
EXAMINED_ENV = "SM120FORK_DOCTOR_EXAMINES"


def serving_python(named: Path | None) -> tuple[str, str]:
    """The interpreter SGLang serves from, and why that one: ``--python``; else the one
    the plugin wheel's doctor is installed in (beside that SGLang); else ``python3`` on
    PATH, as the user's shell finds it (nox puts its own environment first: left out)."""
    if named is not None:
        found = shutil.which(str(named))
        if found is None or not os.access(found, os.X_OK):
            raise UsageError(f"--python {named}: no such interpreter",
                             fix="give the python that runs SGLang, e.g. /srv/venv/bin/python")
        return found, "named by --python"
    if not __name__.startswith("sm120fork."):  # the plugin wheel's copy of the doctor
        return sys.executable, "the Python sm120fork-doctor is installed in; --python names another"
    path = os.environ.get("PATH", "").split(os.pathsep)
    if _nox_session() is not None:
        own = Path(sys.prefix).resolve()
        path = [d for d in path if d and not Path(d).resolve().is_relative_to(own)]
    found = shutil.which("python3", path=os.pathsep.join(_before_pyenv_exec(path)))
    if found is None:
        from ..util import hint  # the toolkit's copy only: the plugin's returned above

        raise UsageError("no python3 on PATH to examine", fix="name the Python SGLang serves "
                         f"from: {hint.command('doctor', '--python', '/path/to/python')}")
    return found, "python3 on PATH; --python names another"


def _before_pyenv_exec(path: list[str]) -> list[str]:
    """PATH as the shell had it before a pyenv shim ran its program through ``pyenv exec``
    (which puts the version's bin, pyenv's libexec and its plugins' bins first)."""
    libexec = next((i for i, d in enumerate(path) if d and Path(d, "pyenv-exec").is_file()),
                   None)
    root = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser().resolve()
    # Only pyenv's own prefix, at the front: a venv the user put before a PATH that was
    # itself made by ``pyenv exec`` (a shell started from a pyenv-launched program) stays.
    if libexec is None or not all(Path(d).resolve().is_relative_to(root / "versions")
                                  for d in path[:libexec]):
        return path
    plugins = root / "plugins"
    rest = path[libexec + 1:]
    while rest and Path(rest[0]).resolve().parent.parent == plugins:
        rest = rest[1:]
    return rest


def elsewhere(python: str, why: str, argv: Sequence[str]) -> int:
    """Run this doctor, unchanged, in another interpreter; pass its output and exit on.
    Only the package goes on its path (a link in a temporary folder: the folder holding it
    has other packages that would shadow the serving environment's)."""
    import tempfile

    package_dir = Path(__file__).resolve().parent.parent
    package = __package__.rpartition(".")[0]
    with tempfile.TemporaryDirectory(prefix="sm120fork-doctor-") as tmp:
        (Path(tmp) / package).symlink_to(package_dir, target_is_directory=True)
        path = os.pathsep.join([tmp, *filter(None, [os.environ.get("PYTHONPATH")])])
        done = proc.run([python, "-m", f"{package}.doctor", *argv], check=False, quiet=True,
                        env={"PYTHONPATH": path, EXAMINED_ENV: why})
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


def main(argv: Sequence[str] | None = None, probes: Probes | None = None) -> int:
    """The doctor's entry point, in the one error boundary (:mod:`sm120fork.entry`)."""
    return boundary(lambda: _main(argv, probes), name="sm120fork-doctor",
                    on_interrupt=proc.end_children)


def _main(argv: Sequence[str] | None, probes: Probes | None) -> int:
    args = parser().parse_args(argv)
    if args.facts is not None and args.python is not None:
        raise UsageError("--facts judges a record; --python looks at an environment: "
                         "use one of them")
    if args.facts is not None and args.record is not None:
        raise UsageError("--facts judges a record; --record makes one: use one of them")
    why = os.environ.pop(EXAMINED_ENV, None)
    if args.facts is not None:
        why, facts = f"the facts in {args.facts}", read_facts(args.facts)
    else:
        if why is None and probes is None:
            python, why = serving_python(args.python)
            here = Path(sys.executable)   # the same file in the same folder, not a venv's link
            if (Path(python).parent.resolve() != here.parent.resolve()
                    or not os.path.samefile(python, here)):
                # its --python is passed on unread: the examined doctor knows ``why`` already
                return elsewhere(python, why, sys.argv[1:] if argv is None else argv)
        facts = collect(probes or Probes(
            peers=functools.partial(ipc_probe, pair_timeout=args.pair_timeout),
            decisions=functools.partial(sglang_decisions, timeout=args.decide_timeout),
            flashinfer=functools.partial(flashinfer_facts, timeout=args.decide_timeout)),
            extra_tp=args.tp)
        if args.record is not None:
            args.record.write_text(json.dumps(portable(facts), indent=1) + "\n",
                                   encoding="utf-8")
    report = judge(facts, base_gpu=args.base_gpu_id, tp=args.tp)
    report.examined(facts, why or "the interpreter this doctor runs in")
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    if args.record is not None:
        sys.stderr.write(f"facts recorded in {args.record}\n")
    if report.blockers:
        return DoctorError(f"{len(report.blockers)} blocker(s)").exit_code
    return 0
