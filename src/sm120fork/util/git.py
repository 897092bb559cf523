"""The one git wrapper: every git command goes through the process runner.

``git`` runs as a child of :func:`sm120fork.util.proc.run`, in its own process group and
known to :func:`~sm120fork.util.proc.end_children`, so Ctrl-C or SIGTERM also stops a
running ``git am`` (GitPython's own subprocesses were out of the runner's reach). Each
command is echoed at debug level (``+ git am ...``: ``-v`` shows it); a failure becomes a
``CommandError`` naming the command and the repository, with git's output attached.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping
from pathlib import Path

from sm120fork.errors import CommandError
from sm120fork.util import proc

log = logging.getLogger("sm120fork")

#: Fixed identity and dates so that commits made by the toolkit are reproducible.
TOOLKIT_AUTHOR_NAME = "sm120fork"
TOOLKIT_AUTHOR_EMAIL = "sm120fork@localhost.invalid"
FIXED_DATE = "2000-01-01T00:00:00+00:00"

#: git's messages in English whatever the user's locale, as the toolkit parses some.
_C_LOCALE = {"LANGUAGE": "C", "LC_ALL": "C"}


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


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(path: Path, args: tuple[str, ...], env: Mapping[str, str] | None) -> str:
    full_env = {**git_env(), **_C_LOCALE, **(env or {})}
    try:
        done = proc.run(["git", *args], cwd=path, env=full_env, check=False, quiet=True)
    except CommandError as exc:  # git missing, or the run is being interrupted
        raise CommandError(f"git {args[0]} could not run: {exc.what}", where=str(path),
                           fix=exc.fix) from exc
    if done.returncode != 0:
        raise CommandError(f"git {args[0]} failed (exit {done.returncode})", where=str(path),
                           detail=_tail(f"{done.stdout}\n{done.stderr}"))
    return done.stdout


class Git:
    """A git work tree at ``path``, driven through the process runner."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not (path / ".git").exists():
            raise CommandError(
                "not a git repository", where=str(path),
                fix="remove the directory so the toolkit can recreate it",
            )

    @classmethod
    def init(cls, path: Path) -> Git:
        path.mkdir(parents=True, exist_ok=True)
        log.debug("+ git init %s", path)
        _run(path, ("init", "--quiet", "--initial-branch=main"), None)
        g = cls(path)
        for key, value in (("user.name", TOOLKIT_AUTHOR_NAME),
                           ("user.email", TOOLKIT_AUTHOR_EMAIL), ("core.autocrlf", "false"),
                           ("core.fileMode", "true"), ("gc.auto", "0")):
            _run(path, ("config", key, value), None)
        return g

    def __call__(self, *args: str, env: Mapping[str, str] | None = None,
                 quiet: bool = False, strip: bool = True) -> str:
        """Run ``git <args>`` in the work tree; its stdout (one trailing newline off)."""
        if not quiet:
            log.debug("+ git %s", shlex.join(args))
        out = _run(self.path, args, env)
        return out[:-1] if strip and out.endswith("\n") else out

    def head(self) -> str:
        return self("rev-parse", "HEAD", quiet=True)

    def is_dirty(self) -> bool:
        return bool(self("status", "--porcelain", "--untracked-files=all", quiet=True))

    def am_in_progress(self) -> bool:
        """A ``git am`` stopped half-way (conflict or interruption)."""
        return (self.path / ".git" / "rebase-apply").exists()

    def tree_hash(self, rev: str = "HEAD") -> str:
        return self("rev-parse", f"{rev}^{{tree}}", quiet=True)
