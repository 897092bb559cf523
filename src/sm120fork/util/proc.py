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
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import git

from sm120fork.errors import CommandError

log = logging.getLogger("sm120fork")

#: Fixed identity and dates so that commits made by the toolkit are reproducible.
TOOLKIT_AUTHOR_NAME = "sm120fork"
TOOLKIT_AUTHOR_EMAIL = "sm120fork@localhost.invalid"
FIXED_DATE = "2000-01-01T00:00:00+00:00"


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
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, echoing it; raise ``CommandError`` with its output if it fails."""
    argv = [os.fspath(c) for c in cmd]
    if not quiet:
        log.info("+ %s", shlex.join(argv))
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(
            argv, cwd=cwd, env=full_env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )
    except FileNotFoundError as exc:
        raise CommandError(
            f"command not found: {argv[0]}", fix="install it or put it on PATH"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"timed out after {timeout}s: {shlex.join(argv)}") from exc
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
