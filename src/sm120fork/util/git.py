"""git through GitPython, every git process started by the one runner (so Ctrl-C also
stops a running ``git am``); a failure is :class:`GitError` with git's stderr attached."""

from __future__ import annotations

import io
import logging
import os
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import git as gitpython
from git.exc import GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from sm120fork.errors import CommandError
from sm120fork.util import proc

log = logging.getLogger("sm120fork")

#: Commits the toolkit makes are reproducible.
TOOLKIT_AUTHOR_NAME = "sm120fork"
TOOLKIT_AUTHOR_EMAIL = "sm120fork@localhost.invalid"
FIXED_DATE = "2000-01-01T00:00:00+00:00"

#: git's messages in English whatever the user's locale, as the toolkit parses some.
_C_LOCALE = {"LANGUAGE": "C", "LC_ALL": "C"}


def _subcommand(argv: Sequence[str]) -> str:
    """``am`` of ``git -c x=y am --quiet ...``."""
    it = iter(argv[1:])
    for arg in it:
        if arg in ("-c", "-C"):
            next(it, None)
        elif not arg.startswith("-"):
            return arg
    return "(none)"


class GitError(CommandError, GitCommandError):
    """Both the toolkit's ``CommandError`` and GitPython's ``GitCommandError``, which
    GitPython's own code expects (``Repo.is_ancestor``)."""

    def __init__(self, argv: Sequence[str], status: int, stderr: str, stdout: str, *,
                 where: str | None) -> None:
        tail = f"{stdout}\n{stderr}".strip().splitlines()[-40:]
        CommandError.__init__(self, f"git {_subcommand(argv)} failed (exit {status})",
                              where=where, detail="\n".join(tail))
        GitCommandError.__init__(self, list(argv), status, stderr, stdout)
        self.stderr: str = stderr  # GitPython's own keeps a formatted copy
        self.stdout: str = stdout
        self.args = (self.message,)

    def __str__(self) -> str:
        return self.message


class RunnerGit(gitpython.Git):
    """:meth:`execute`, where every GitPython operation that runs git ends, uses the runner."""

    def execute(  # one signature for GitPython's overloads
        self,
        command: str | Sequence[Any],
        istream: int | IO[bytes] | None = None,
        with_extended_output: bool = False,
        with_exceptions: bool = True,
        as_process: bool = False,
        output_stream: IO[bytes] | None = None,
        stdout_as_string: bool = True,
        kill_after_timeout: float | None = None,
        with_stdout: bool = True,
        universal_newlines: bool = False,
        shell: bool | None = None,
        env: Mapping[str, str] | None = None,
        max_chunk_size: int = 0,
        strip_newline_in_stdout: bool = True,
        **subprocess_kwargs: Any,
    ) -> Any:
        if isinstance(command, str) or shell:
            raise CommandError("git commands run as an argument list, never through a shell",
                               fix="pass the command as a sequence of arguments")
        argv = [os.fspath(c) if isinstance(c, os.PathLike) else str(c) for c in command]
        full_env = {**os.environ, **_C_LOCALE, **self._environment, **(env or {})}
        cwd = os.fspath(self._working_dir) if self._working_dir else None
        log.debug("+ %s", shlex.join(argv))
        if as_process:
            child = proc.spawn(argv, cwd=cwd, env=full_env,
                               stdin=istream if istream is not None else subprocess.DEVNULL)
            return self.AutoInterrupt(child, argv)
        data = istream.read() if isinstance(istream, io.BytesIO) else None
        try:
            done = proc.capture(argv, cwd=cwd, env=full_env, input=data,
                                stdin=None if data is not None else istream,
                                timeout=kill_after_timeout)
        except CommandError as exc:  # git missing, timed out, or the run being interrupted
            raise CommandError(f"git {_subcommand(argv)} could not run: {exc.what}",
                               where=str(cwd) if cwd else None, fix=exc.fix) from exc
        out: bytes = done.stdout if with_stdout else b""
        err = done.stderr.decode("utf-8", "replace").removesuffix("\n")
        if done.returncode != 0 and with_exceptions:
            raise GitError(argv, done.returncode, err, out.decode("utf-8", "replace"),
                           where=str(cwd) if cwd else None)
        kept = out.removesuffix(b"\n") if strip_newline_in_stdout else out
        value: str | bytes | IO[bytes] = kept
        if output_stream is not None:
            output_stream.write(out)
            value = output_stream
        elif stdout_as_string or universal_newlines:
            value = kept.decode("utf-8", "replace")
        if with_extended_output:
            return (done.returncode, value, err)
        return value

    # One ``cat-file`` per object instead of GitPython's long-lived ``--batch`` process,
    # so nothing keeps running behind a handle.

    def get_object_header(self, ref: str | bytes) -> tuple[str, str, int]:
        header = self._cat_file("--batch-check", ref).partition(b"\n")[0]
        # bytes, as GitPython's own reader passes them (its annotation says str)
        return self._parse_object_header(header)  # type: ignore[arg-type]

    def stream_object_data(self, ref: str | bytes
                           ) -> tuple[str, str, int, gitpython.Git.CatFileContentStream]:
        header, _, data = self._cat_file("--batch", ref).partition(b"\n")
        hexsha, typename, size = self._parse_object_header(header)  # type: ignore[arg-type]
        return hexsha, typename, size, self.CatFileContentStream(size, io.BytesIO(data))

    def _cat_file(self, mode: str, ref: str | bytes) -> bytes:
        out: bytes = self.execute(["git", "cat-file", mode],
                                  istream=io.BytesIO(self._prepare_ref(ref)),
                                  stdout_as_string=False, strip_newline_in_stdout=False)
        return out


class Repo(gitpython.Repo):
    GitCommandWrapperType = RunnerGit


class Git:
    """A git work tree; every commit made in it has the toolkit's identity and date."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            if not (path / ".git").exists():
                raise InvalidGitRepositoryError(path)
            self.repo = Repo(path)
        except (InvalidGitRepositoryError, NoSuchPathError) as exc:
            raise CommandError("not a git repository", where=str(path),
                               fix="remove the directory so the toolkit can recreate it"
                               ) from exc
        self.repo.git.update_environment(
            GIT_AUTHOR_NAME=TOOLKIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL=TOOLKIT_AUTHOR_EMAIL,
            GIT_COMMITTER_NAME=TOOLKIT_AUTHOR_NAME, GIT_COMMITTER_EMAIL=TOOLKIT_AUTHOR_EMAIL,
            GIT_AUTHOR_DATE=FIXED_DATE, GIT_COMMITTER_DATE=FIXED_DATE)

    @classmethod
    def init(cls, path: Path) -> Git:
        path.mkdir(parents=True, exist_ok=True)
        Repo.init(path, initial_branch="main", quiet=True)
        g = cls(path)
        with g.repo.config_writer() as config:
            config.set_value("user", "name", TOOLKIT_AUTHOR_NAME)
            config.set_value("user", "email", TOOLKIT_AUTHOR_EMAIL)
            config.set_value("core", "autocrlf", "false")
            config.set_value("core", "fileMode", "true")
            config.set_value("gc", "auto", "0")
        return g

    def __call__(self, *args: str, env: Mapping[str, str] | None = None,
                 strip: bool = True) -> str:
        """``git <args>`` in the work tree; its stdout (one trailing newline off)."""
        out: str = self.repo.git.execute(["git", *args], env=env,
                                         strip_newline_in_stdout=strip)
        return out

    def head(self) -> str:
        return self.repo.head.commit.hexsha

    def commit(self, rev: str) -> gitpython.Commit:
        """The commit ``rev`` names (a tag peeled); ``CommandError`` if none."""
        try:
            return self.repo.commit(rev)
        except (gitpython.BadName, gitpython.BadObject, ValueError, IndexError) as exc:
            raise CommandError(f"no commit {rev!r}", where=str(self.path)) from exc

    def tree_hash(self, rev: str = "HEAD") -> str:
        return self.commit(rev).tree.hexsha

    def is_dirty(self) -> bool:
        """Changes to tracked files, staged or not, or untracked files (not ignored ones)."""
        return bool(self("status", "--porcelain", "--untracked-files=all"))

    def am_in_progress(self) -> bool:
        return (Path(self.repo.git_dir) / "rebase-apply").exists()

    def commits(self, rev_range: str) -> list[gitpython.Commit]:
        """Oldest first."""
        return list(reversed(list(self.repo.iter_commits(rev_range))))

    def show(self, rev: str, path: str) -> str | None:
        """The text of ``path`` at ``rev``; None where ``rev`` has no such file."""
        try:
            blob = self.commit(rev).tree / path
        except KeyError:
            return None
        if not isinstance(blob, gitpython.Blob):
            return None
        data: bytes = blob.data_stream.read()
        return data.decode("utf-8", "replace")

    def exists(self, rev: str, path: str) -> bool:
        try:
            self.commit(rev).tree / path.rstrip("/")
        except KeyError:
            return False
        return True

    def commit_time(self) -> int:
        return int(self.commit("HEAD").committed_date)

    def files(self, rev: str, under: str = "") -> list[str]:
        """Every file at ``rev`` (below folder ``under``), sorted."""
        out = self("ls-tree", "-r", "-z", "--name-only", self.commit(rev).hexsha, "--",
                   *([under] if under else []))
        return sorted(name for name in out.split("\0") if name)

    def tag(self, name: str, rev: str = "HEAD") -> None:
        self.repo.create_tag(name, ref=rev, force=True)

    def commit_all(self, message: str) -> str:
        """Commit every file, ignored ones too (an upstream source as it is), without hooks."""
        self("add", "-A", "--force", ".")
        self("commit", "-q", "--no-verify", "-m", message)
        return self.head()

    def am(self, patches: Iterable[Path], *, extra: Sequence[str] = ()) -> None:
        """``git am`` without 3-way; a patch that does not apply raises :class:`GitError`
        and leaves the ``am`` stopped on it."""
        self("am", "--quiet", "--no-3way", "--keep-cr", *extra, *(str(p) for p in patches))
