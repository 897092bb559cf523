"""The one process runner: each command echoed (``+ cmd``), run with check in a process
group of its own, its output shown only on failure; :func:`end_children` ends them all on
an interrupt.  Stdlib only: the doctor and the GPU harness import it."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..errors import CommandError

log = logging.getLogger("sm120fork")

#: Weakly held: a dropped streaming child leaves by itself.
_children: weakref.WeakSet[subprocess.Popen[Any]] = weakref.WeakSet()
#: Streaming helpers (:func:`spawn`): ended with the rest, not counted.
_helpers: weakref.WeakSet[subprocess.Popen[Any]] = weakref.WeakSet()
_children_lock = threading.Lock()
_ending = threading.Event()
_ended: list[int] = []


def end_children(grace: float = 5.0) -> int:
    """End every running command with its group and refuse new ones (SIGTERM may reach
    only this process); how many were ended since :func:`allow_children`."""
    _ending.set()
    with _children_lock:
        running = [p for p in _children if p.poll() is None]
        helpers = [p for p in _helpers if p.poll() is None]
    for p in [*running, *helpers]:
        with _suppress_gone():
            os.killpg(p.pid, signal.SIGTERM)
    for p in [*running, *helpers]:
        _reap(p, grace)
    _ended.extend(p.pid for p in running)
    return len(_ended)


def _reap(child: subprocess.Popen[Any], grace: float) -> None:
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        with _suppress_gone():
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def allow_children() -> None:
    _ending.clear()
    _ended.clear()


def _suppress_gone() -> contextlib.suppress:
    return contextlib.suppress(ProcessLookupError, PermissionError)


def run(cmd: Sequence[str | os.PathLike[str]], *, cwd: Path | None = None,
        env: Mapping[str, str] | None = None, check: bool = True,
        timeout: float | None = None, quiet: bool = False,
        on_line: Callable[[str], None] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``on_line`` sees each line of stdout and stderr together as it comes."""
    if input is not None and on_line is not None:
        raise ValueError("input and on_line do not go together")
    argv = [os.fspath(c) for c in cmd]
    if not quiet:
        log.info("+ %s", shlex.join(argv))
    child = _start(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                   stdin=subprocess.PIPE if input is not None else None,
                   stderr=subprocess.STDOUT if on_line else subprocess.PIPE,
                   text=True, encoding="utf-8", errors="replace")
    with _waiting(child, argv, timeout):
        if on_line is not None and child.stdout is not None:
            lines: list[str] = []
            with child.stdout:
                for line in child.stdout:
                    lines.append(line)
                    on_line(line.rstrip("\n"))
            stdout, stderr = "".join(lines), ""
            child.wait(timeout)
        else:
            stdout, stderr = child.communicate(input, timeout=timeout)
    proc = subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        output = f"{proc.stdout or ''}\n{proc.stderr or ''}".rstrip().splitlines()[-40:]
        raise CommandError(f"command failed with exit code {proc.returncode}: "
                           f"{shlex.join(argv)}", where=str(cwd) if cwd else None,
                           detail="\n".join(output))
    return proc


def _start(argv: list[str], *,
           registry: weakref.WeakSet[subprocess.Popen[Any]] = _children,
           **popen: Any) -> subprocess.Popen[Any]:
    if _ending.is_set():
        raise CommandError(f"not started, the run is being interrupted: {shlex.join(argv)}")
    try:
        child = subprocess.Popen(argv, start_new_session=True, **popen)
    except FileNotFoundError as exc:
        raise CommandError(f"command not found: {argv[0]}",
                           fix="install it or put it on PATH") from exc
    with _children_lock:
        registry.add(child)
    return child


@contextlib.contextmanager
def _waiting(child: subprocess.Popen[Any], argv: list[str], timeout: float | None,
             ) -> Iterator[None]:
    try:
        yield
    except subprocess.TimeoutExpired as exc:
        with _suppress_gone():
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        error = CommandError(f"timed out after {timeout}s: {shlex.join(argv)}")
        error.timed_out = True
        raise error from exc
    except BaseException:  # interrupted while waiting here: the child ends with us
        with _suppress_gone():
            os.killpg(child.pid, signal.SIGTERM)
        _reap(child, 5.0)
        raise
    finally:
        with _children_lock:
            _children.discard(child)


def spawn(cmd: Sequence[str | os.PathLike[str]], *, cwd: Path | str | None = None,
          env: Mapping[str, str], stdin: IO[bytes] | int | None = subprocess.DEVNULL,
          stdout: IO[bytes] | int | None = subprocess.PIPE,
          stderr: IO[bytes] | int | None = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """Running, silent and unchecked, for a reader of its stream (GitPython)."""
    child: subprocess.Popen[bytes] = _start(
        [os.fspath(c) for c in cmd], cwd=cwd, env=dict(env), stdin=stdin, stdout=stdout,
        stderr=stderr, registry=_helpers)
    return child


def capture(cmd: Sequence[str | os.PathLike[str]], *, cwd: Path | str | None = None,
            env: Mapping[str, str], stdin: IO[bytes] | int | None = None,
            input: bytes | None = None, timeout: float | None = None,
            ) -> subprocess.CompletedProcess[bytes]:
    """Bytes, silent and unchecked, for a caller that echoes and judges itself (git)."""
    argv = [os.fspath(c) for c in cmd]
    child = _start(argv, cwd=cwd, env=dict(env),
                   stdin=subprocess.PIPE if input is not None else
                   (subprocess.DEVNULL if stdin is None else stdin),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with _waiting(child, argv, timeout):
        stdout, stderr = child.communicate(input, timeout=timeout)
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)


class ProcessGroup:
    """Processes started and ended together (ranks): leaving the block kills each with its
    group and reaps it."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str],
              stdout: IO[bytes] | int | None = None,
              stderr: IO[bytes] | int | None = subprocess.STDOUT,
              stdin: IO[bytes] | int | None = None,
              pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
        child: subprocess.Popen[bytes] = _start(
            [os.fspath(c) for c in cmd], stdin=stdin, stdout=stdout, stderr=stderr,
            env=dict(env), pass_fds=tuple(pass_fds))
        self.procs.append(child)
        return child

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def kill(self) -> None:
        for child in self.procs:
            if child.poll() is None:
                with _suppress_gone():
                    os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            with _children_lock:
                _children.discard(child)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()
