"""The one process runner: each command echoed (``+ cmd``), run with check in a process
group of its own, its output shown only on failure; :func:`end_children` ends them all on
an interrupt.  :func:`run_group` supervises children started together (A/B ranks, layer
ranks, probes): it follows their logs in the one wire format and ends the whole group on a
crash, a ``FATAL``, a bad line, a timeout or an interrupt, returning how it ended.  Stdlib
only: the doctor and the GPU harness import it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..errors import CommandError
from . import wire

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
          env: Mapping[str, str], stdin: IO[bytes] | int | None) -> subprocess.Popen[bytes]:
    """Running, silent and unchecked, for a reader of its stream (GitPython)."""
    child: subprocess.Popen[bytes] = _start(
        [os.fspath(c) for c in cmd], cwd=cwd, env=dict(env), stdin=stdin,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, registry=_helpers)
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
              pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
        child: subprocess.Popen[bytes] = _start(
            [os.fspath(c) for c in cmd], stdin=None, stdout=stdout, stderr=stderr,
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


TAIL_LINES = 25
POLL_S = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Bounds on a group, None for none.  A child is ready once it said the ready tag or,
    without one, printed its first line; ``startup`` runs until all are, ``idle`` between
    lines after, ``run`` from ready to the end, ``grace`` after a crash (None: until the
    caller's ``settled``), ``deadline`` is a ``time.monotonic()`` value."""

    startup: float | None = None
    idle: float | None = None
    run: float | None = None
    grace: float | None = None
    deadline: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Child:
    argv: Sequence[str]
    env: Mapping[str, str]
    #: stdout (and stderr unless ``stderr`` is given), followed as it grows.
    log: Path
    stderr: Path | None = None
    name: str = ""


@dataclasses.dataclass
class ChildEnd:
    name: str
    returncode: int | None = None
    #: Still running when the group ended.
    stopped: bool = False
    ended_at: float | None = None
    messages: list[wire.Message] = dataclasses.field(default_factory=list)

    def last(self, tag: str) -> object:
        return next((m.data for m in reversed(self.messages) if m.tag == tag), None)

    def said(self, tag: str) -> bool:
        return any(m.tag == tag for m in self.messages)


@dataclasses.dataclass
class GroupOutcome:
    ok: bool
    failure: str | None = None
    #: "crash", "hang", "fatal", "protocol" or "budget"
    kind: str | None = None
    #: The child whose exit ended the group (a "crash").
    failed: int | None = None
    returncodes: list[int | None] = dataclasses.field(default_factory=list)
    tails: list[list[str]] = dataclasses.field(default_factory=list)
    children: list[ChildEnd] = dataclasses.field(default_factory=list)
    ready_at: float | None = None
    started_at: float = 0.0


class _Follower:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""
        self.tail: list[str] = []

    def poll(self, final: bool = False) -> list[str]:
        """The lines complete since the last poll (``final``: and a last one unended)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        self.offset += len(chunk)
        lines = (self.partial + chunk.decode("utf-8", "replace")).split("\n")
        self.partial = "" if final else lines.pop()
        if final and not lines[-1]:
            lines.pop()
        self.tail = (self.tail + lines)[-TAIL_LINES:]
        return lines


def _sigterm(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C inside the block, unless the program handles SIGTERM
    already or this is not the main thread."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def ending_children() -> Iterator[None]:
    """Ctrl-C or SIGTERM in a block waiting on other threads' children ends them all at
    once (a pool's exit would otherwise wait for each)."""
    with sigterm_unwinds():
        try:
            yield
        except KeyboardInterrupt:
            end_children()
            raise


@dataclasses.dataclass
class _Watch:
    children: Sequence[Child]
    timeouts: Timeouts
    ready: str | None
    fail_fast: bool
    settled: Callable[[list[int | None]], bool] | None
    on_message: Callable[[int, wire.Message], None] | None
    outcome: GroupOutcome = dataclasses.field(init=False)
    names: list[str] = dataclasses.field(init=False)
    followers: list[_Follower] = dataclasses.field(init=False)
    spoken: list[bool] = dataclasses.field(init=False)
    problem: list[str] = dataclasses.field(default_factory=list)
    failed_since: float | None = None
    last: float = 0.0

    def __post_init__(self) -> None:
        self.names = [c.name or f"rank {i}" for i, c in enumerate(self.children)]
        self.followers = [_Follower(c.log) for c in self.children]
        self.spoken = [False] * len(self.children)
        self.outcome = GroupOutcome(ok=False, children=[ChildEnd(name=n) for n in self.names],
                                    started_at=time.monotonic())
        self.last = self.outcome.started_at

    def take(self, idx: int, line: str) -> None:
        self.spoken[idx] = True
        try:
            message = wire.decode(line)
        except wire.WireError as exc:
            self.problem.append(f"{self.names[idx]}: {exc}")
            return
        if message is None:
            return
        self.outcome.children[idx].messages.append(message)
        if self.on_message:
            self.on_message(idx, message)

    def step(self, codes: list[int | None]) -> tuple[str, str] | None:
        """(failure, kind) when the group ends now ("" ends it as ok)."""
        ends = self.outcome.children
        now = time.monotonic()
        for idx, code in enumerate(codes):
            if code is not None and ends[idx].ended_at is None:
                ends[idx].ended_at = now
        for idx, follower in enumerate(self.followers):
            for line in follower.poll():
                self.last = time.monotonic()
                self.take(idx, line)
        now = time.monotonic()
        fatal = next((f"{self.names[i]}: {m.data}" for i, e in enumerate(ends)
                      for m in e.messages if m.tag == "FATAL"), None)
        if self.problem and self.fail_fast:
            return self.problem[0], "protocol"
        if fatal and self.fail_fast:
            return fatal, "fatal"
        if self.outcome.ready_at is None and all(
                (e.said(self.ready) if self.ready else self.spoken[i] or codes[i] is not None)
                for i, e in enumerate(ends)):
            self.outcome.ready_at = now
        ended = self._exited(codes, now)
        if ended is not None:
            return ended
        if self.timeouts.deadline is not None and now > self.timeouts.deadline:
            return "time budget exhausted", "budget"
        hung = self._hung(codes, now)
        return (hung, "hang") if hung else None

    def _exited(self, codes: list[int | None], now: float) -> tuple[str, str] | None:
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed and self.failed_since is None:
            self.failed_since = now
        grace = self.timeouts.grace
        idle = self.timeouts.idle
        if failed and self.fail_fast and self.failed_since is not None and (
                None not in codes
                or (grace is not None and now - self.failed_since > grace)
                or (grace is None and (self.settled is None or self.settled(codes)
                                       or (idle is not None and now - self.last > idle)))):
            i, c = failed[0]
            self.outcome.failed = i
            by_signal = f" (signal {-c})" if c < 0 else ""
            return f"{self.names[i]} exited with code {c}{by_signal}", "crash"
        if all(c is not None for c in codes):
            self.outcome.ok = not failed
            return ("; ".join(f"process {i} exited with code {c}" for i, c in failed),
                    "crash")
        return None

    def _hung(self, codes: list[int | None], now: float) -> str | None:
        t = self.timeouts
        stuck = [i for i, c in enumerate(codes) if c is None]
        quiet = now - self.last
        if self.outcome.ready_at is None:
            starting = (self.ready is not None or any(
                not s and c is None for s, c in zip(self.spoken, codes, strict=True)))
            limit = t.startup if starting else t.idle
            since = self.outcome.started_at if starting else self.last
            if limit is None or now - since <= limit or (t.idle is not None
                                                         and quiet <= t.idle):
                return None
            if not self.ready:
                return f"watchdog: no output for {limit:.0f} s; ranks still running: {stuck}"
            return (f"watchdog: not ready within {limit:.0f} s; still running: "
                    f"{[self.names[i] for i in stuck]}")
        if t.idle is not None and quiet > t.idle:
            return f"watchdog: no output for {t.idle:.0f} s; ranks still running: {stuck}"
        if t.run is not None and now - self.outcome.ready_at > t.run:
            return (f"watchdog: not finished {t.run:.0f} s after every child was ready; "
                    f"still running: {[self.names[i] for i in stuck]}")
        return None

    def finish(self, group: ProcessGroup) -> None:
        now = time.monotonic()
        for end, p in zip(self.outcome.children, group.procs, strict=True):
            end.stopped = p.poll() is None
            if not end.stopped and end.ended_at is None:
                end.ended_at = now
        group.kill()
        for idx, follower in enumerate(self.followers):
            for line in follower.poll(final=True):
                self.take(idx, line)


def run_group(children: Sequence[Child], *, timeouts: Timeouts,
              on_message: Callable[[int, wire.Message], None] | None = None,
              ready: str | None = None, fail_fast: bool = True,
              settled: Callable[[list[int | None]], bool] | None = None) -> GroupOutcome:
    """Run ``children`` under ``timeouts``; how they ended.  With ``fail_fast`` a crash
    ends the group once ``settled(returncodes)`` holds (the others reported what the
    failed one finished) or ``timeouts.grace`` passed.  Exit codes are read before the
    logs, so what a child printed before exiting is seen with its exit."""
    watch = _Watch(children, timeouts, ready, fail_fast, settled, on_message)
    outcome = watch.outcome
    with sigterm_unwinds(), ProcessGroup() as group:
        for child in children:
            child.log.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.ExitStack() as files:
                out = files.enter_context(child.log.open("wb"))
                err = files.enter_context(child.stderr.open("wb")) if child.stderr else None
                group.start(child.argv, env=child.env, stdout=out, stderr=err or subprocess.STDOUT)
        try:
            while (ended := watch.step(group.poll())) is None:
                time.sleep(POLL_S)
            outcome.failure, outcome.kind = ended if ended[0] else (None, None)
        finally:
            watch.finish(group)
    if watch.problem and outcome.kind in (None, "crash"):
        outcome.ok, outcome.failure, outcome.kind = False, watch.problem[0], "protocol"
    for end, p in zip(outcome.children, group.procs, strict=True):
        end.returncode = p.returncode
    outcome.returncodes = [p.returncode for p in group.procs]
    outcome.tails = [f.tail for f in watch.followers]
    return outcome
