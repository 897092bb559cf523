"""The one wrapper for subprocesses and the one for git.

Commands are echoed through the ``sm120fork`` logger (``+ python -m build ...`` at info
level, ``+ git am ...`` at debug level: ``-v`` shows them), run with check, and their
captured output is shown only when they fail.  GitPython's
``GitCommandError`` becomes the toolkit's ``CommandError`` with stderr attached.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import git

from sm120fork.errors import CommandError

log = logging.getLogger("sm120fork")

#: Fixed identity and dates so that commits made by the toolkit are reproducible.
TOOLKIT_AUTHOR_NAME = "sm120fork"
TOOLKIT_AUTHOR_EMAIL = "sm120fork@localhost.invalid"
FIXED_DATE = "2000-01-01T00:00:00+00:00"


_children: set[subprocess.Popen[str]] = set()
_children_lock = threading.Lock()
_ending = threading.Event()
_ended: list[int] = []


def end_children(grace: float = 5.0) -> int:
    """End every command started by :func:`run` (each with its own process group, so a
    build's own children go too) and refuse new ones; return how many were ended since
    :func:`allow_children`.

    Called when the toolkit is interrupted: SIGTERM may reach only this process (nox
    forwards it alone), and a child left running would keep building."""
    _ending.set()
    with _children_lock:
        running = [p for p in _children if p.poll() is None]
    for p in running:
        with _suppress_gone():
            os.killpg(p.pid, signal.SIGTERM)
    for p in running:
        _reap(p, grace)
    _ended.extend(p.pid for p in running)
    return len(_ended)


def _reap(child: subprocess.Popen[str], grace: float) -> None:
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        with _suppress_gone():
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def allow_children() -> None:
    """Undo :func:`end_children` (a new command in the same process, e.g. tests)."""
    _ending.clear()
    _ended.clear()


class _suppress_gone:  # noqa: N801 - a tiny context manager, used like contextlib.suppress
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    quiet: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, echoing it; raise ``CommandError`` with its output if it fails.

    ``on_line`` sees each line of output (stdout and stderr together) as it comes, for a
    live progress line; the lines are then ``stdout`` of the result."""
    argv = [os.fspath(c) for c in cmd]
    if not quiet:
        log.info("+ %s", shlex.join(argv))
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    if _ending.is_set():
        raise CommandError(f"not started, the run is being interrupted: {shlex.join(argv)}")
    try:
        child = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT if on_line else subprocess.PIPE,
                                 text=True, start_new_session=True)
    except FileNotFoundError as exc:
        raise CommandError(
            f"command not found: {argv[0]}", fix="install it or put it on PATH"
        ) from exc
    with _children_lock:
        _children.add(child)
    try:
        if on_line is not None and child.stdout is not None:
            lines: list[str] = []
            with child.stdout:
                for line in child.stdout:
                    lines.append(line)
                    on_line(line.rstrip("\n"))
            stdout, stderr = "".join(lines), ""
            child.wait(timeout)
        else:
            stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        with _suppress_gone():
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise CommandError(f"timed out after {timeout}s: {shlex.join(argv)}") from exc
    except BaseException:  # interrupted while waiting here: the child ends with us
        with _suppress_gone():
            os.killpg(child.pid, signal.SIGTERM)
        _reap(child, 5.0)
        raise
    finally:
        with _children_lock:
            _children.discard(child)
    proc = subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        output = _tail((proc.stdout or "") + "\n" + (proc.stderr or ""))
        raise CommandError(
            f"command failed with exit code {proc.returncode}: {shlex.join(argv)}",
            where=str(cwd) if cwd else None,
            detail=output,
        )
    return proc


def git_env(date: str = FIXED_DATE) -> dict[str, str]:
    """Environment that pins the toolkit's git identity and commit dates."""
    return {
        "GIT_AUTHOR_NAME": TOOLKIT_AUTHOR_NAME,
        "GIT_AUTHOR_EMAIL": TOOLKIT_AUTHOR_EMAIL,
        "GIT_COMMITTER_NAME": TOOLKIT_AUTHOR_NAME,
        "GIT_COMMITTER_EMAIL": TOOLKIT_AUTHOR_EMAIL,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }


class Git:
    """Thin wrapper over a GitPython ``Repo`` that echoes and translates errors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.repo = git.Repo(path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise CommandError(
                "not a git repository", where=str(path),
                fix="remove the directory so the toolkit can recreate it",
            ) from exc

    @classmethod
    def init(cls, path: Path) -> Git:
        path.mkdir(parents=True, exist_ok=True)
        log.debug("+ git init %s", path)
        git.Repo.init(path, initial_branch="main")
        g = cls(path)
        with g.repo.config_writer() as cfg:
            cfg.set_value("user", "name", TOOLKIT_AUTHOR_NAME)
            cfg.set_value("user", "email", TOOLKIT_AUTHOR_EMAIL)
            cfg.set_value("core", "autocrlf", "false")
            cfg.set_value("core", "fileMode", "true")
            cfg.set_value("gc", "auto", "0")
        return g

    def __call__(self, *args: str, env: Mapping[str, str] | None = None,
                 quiet: bool = False, strip: bool = True) -> str:
        if not quiet:
            log.debug("+ git %s", shlex.join(args))
        full_env = dict(git_env())
        if env:
            full_env.update(env)
        try:
            out: str = self.repo.git.execute(
                ["git", *args], env=full_env, strip_newline_in_stdout=strip,
            )
        except git.GitCommandError as exc:
            stderr = str(exc.stderr or "").strip().removeprefix("stderr: ").strip("'")
            stdout = str(exc.stdout or "").strip().removeprefix("stdout: ").strip("'")
            raise CommandError(
                f"git {args[0]} failed (exit {exc.status})",
                where=str(self.path),
                detail=_tail(f"{stdout}\n{stderr}"),
            ) from exc
        return out

    def head(self) -> str:
        return self("rev-parse", "HEAD", quiet=True)

    def is_dirty(self) -> bool:
        return bool(self("status", "--porcelain", "--untracked-files=all", quiet=True))

    def am_in_progress(self) -> bool:
        """A ``git am`` stopped half-way (conflict or interruption)."""
        return (self.path / ".git" / "rebase-apply").exists()

    def tree_hash(self, rev: str = "HEAD") -> str:
        return self("rev-parse", f"{rev}^{{tree}}", quiet=True)
