"""Before a nox session installs anything (in nox's own Python, standard library only):
its arguments read by the verb's own parser and the machine asked by the verb's own
checks, so a mistake ends the session in seconds, not after minutes of installs."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from unittest import mock

from sm120fork.cli.args import bump_revision
from sm120fork.cli.main import VERBS, load, make_parser
from sm120fork.errors import CommandError, ConfigError
from sm120fork.util import proc
from sm120fork.util.hint import FRONT_DOOR_ENV, command
from sm120fork.util.typed import suggest

#: The session that runs cibuildwheel itself (no toolkit verb).
CIBUILDWHEEL = "cibuildwheel"
_HELP = frozenset({"-h", "--help"})


def check(session: str, command: Sequence[str], posargs: Sequence[str]) -> None:
    """The error session ``session`` (``python -m sm120fork COMMAND POSARGS``) would end in
    for a wrong argument or a machine without what the verb needs."""
    if _HELP & set(posargs):
        return
    # the environment nox gives the session's commands: the hints name the session
    with mock.patch.dict(os.environ, {FRONT_DOOR_ENV: "nox", "NOX_CURRENT_SESSION": session}):
        if command[0] == CIBUILDWHEEL:
            container_engine()
            return
        with contextlib.redirect_stderr(io.StringIO()):
            if VERBS[command[0]].own_main:  # the doctor parses its own arguments
                from sm120fork.doctor.cli import parser

                args = parser().parse_args(posargs)
            else:
                args = make_parser([command[0]]).parse_args([*command, *posargs])
        _declared(args)
        need = _NEEDS.get(command[0])
        if need is not None:
            need(args)


def _declared(args: argparse.Namespace, forks: Path = Path("forks")) -> None:
    """Each stack named is declared in ``forks/`` and a ``PROJECT`` is one of its projects
    (a resuming bump's saved state answers for its stack)."""
    if any(getattr(args, flag, False) for flag in ("cont", "skip", "abort")):
        return
    named = getattr(args, "stack", None)
    declared = sorted(path.stem for path in forks.glob("*.toml"))
    for name in [named] if isinstance(named, str) else named or []:
        if declared:
            _one_of("stack", name, declared, f"{forks}/")
    project = getattr(args, "project", None)
    if project and isinstance(named, str) and declared:
        declaration = forks / f"{named}.toml"
        try:
            projects = list(tomllib.loads(declaration.read_text())["projects"])
        except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
            return  # a malformed declaration is the verb's to describe
        _one_of("project", project, projects, str(declaration))


def _one_of(kind: str, name: str, known: list[str], where: str) -> None:
    if name not in known:
        raise ConfigError(f"unknown {kind} {name!r}", where=where,
                          fix=suggest(name, known) or f"choose one of: {', '.join(known)}")


def _built(args: argparse.Namespace, root: Path = Path()) -> None:
    """The stack a kit packs has a build (its manifest)."""
    stack = args.stack
    for declaration in sorted((root / "forks").glob("*.toml")) if stack is None else ():
        with contextlib.suppress(OSError, tomllib.TOMLDecodeError, AttributeError):
            if tomllib.loads(declaration.read_text()).get("stack", {}).get("default") is True:
                stack = declaration.stem
    if stack is not None and not (root / "wheels" / stack / "manifest.json").is_file():
        raise ConfigError(f"stack {stack} has no build in wheels/{stack}",
                          fix=command("build", "--stack", stack))


#: What each verb checks first, of the machine or of arguments its parser cannot judge
#: (its module imported only then).
_NEEDS: dict[str, Callable[[argparse.Namespace], object]] = {
    "gpu": lambda args: load("gpu.cli:ready")(args),  # noqa: PLW0108
    "tune": lambda _: load("tune.cli:ready")(),
    "verify-sm120": lambda _: load("verify:require_compiler")(),
    # the Python the doctor would examine is there
    "doctor": lambda args: args.python and load("doctor.cli:serving_python")(args.python),
    "bump": bump_revision, "gpu-kit": _built}


def container_engine(environ: Mapping[str, str] | None = None,
                     which: Callable[[str], str | None] = shutil.which) -> str:
    """The engine cibuildwheel will use (``CIBW_CONTAINER_ENGINE``), if it answers ``info``."""
    env = os.environ if environ is None else environ
    engine = env.get("CIBW_CONTAINER_ENGINE", "").split(";")[0].strip() or "docker"
    found = which(engine)
    if found is None:
        other = next((e for e in ("docker", "podman") if e != engine and which(e)), None)
        if other is not None:
            raise ConfigError(f"cibuildwheel runs {engine}, which is not on PATH; {other} is",
                              where="CIBW_CONTAINER_ENGINE",
                              fix=f"CIBW_CONTAINER_ENGINE={other} nox -s cibuildwheel")
        raise ConfigError("cibuildwheel builds in containers: neither docker nor podman is "
                          "on PATH", fix="install one of them, or build the same wheel on "
                          "this machine: nox -s build_aot")
    try:
        done = proc.run([found, "info"], check=False, quiet=True, timeout=60)
    except CommandError as exc:
        raise ConfigError(f"`{engine} info` did not answer within 60 s",
                          fix=f"make `{engine} info` work here") from exc
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}")
        raise ConfigError(f"`{engine} info` failed: {said.splitlines()[-1]}",
                          fix=f"make `{engine} info` work here (its daemon running, this "
                              "user allowed to reach it), or build the same wheel on this "
                              "machine: nox -s build_aot")
    return engine
