"""The one supervisor of children the toolkit starts together and waits on: A/B ranks,
layer ranks, a layout's probe.

:func:`run_group` starts N children (each in a process group of its own, through the one
runner's :class:`~sm120fork.util.proc.ProcessGroup`, so Ctrl-C and
:func:`~sm120fork.util.proc.end_children` end them too), follows their output as it is
written, decodes every line of the one wire format (:mod:`sm120fork.util.wire`), and ends
the whole group, each child with its process group, when:

- a child exits with an error (``crash``; with ``fail_fast``), once the caller's
  ``settled`` judgement holds or ``Timeouts.grace`` has passed;
- a child says ``FATAL`` (``fatal``: retrying cannot help);
- a child prints a line with the wire's marker that does not decode (``protocol``: named
  with the child and the line);
- a bound of the one :class:`Timeouts` object passes (``hang``, or ``budget`` for the
  overall deadline);
- the parent is interrupted (Ctrl-C, or SIGTERM, which unwinds like Ctrl-C while the
  group runs): the exception goes on, the children are gone.

How the group ended is returned (:class:`GroupOutcome`), never raised.  Stdlib only.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from . import proc, wire

TAIL_LINES = 25


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Every bound on a group of children, in one object (None: no such bound).

    A child is *ready* once it said the group's ready tag (``run_group(ready=...)``) or,
    without one, once it printed its first line."""

    #: From the start until every running child is ready (interpreter start, imports);
    #: a child that starts slower than the others is not a hang while this holds.
    startup: float | None = None
    #: Between two lines of output, once every running child is ready.
    idle: float | None = None
    #: From the moment every child is ready to the end of the group.
    run: float | None = None
    #: After a child exited with an error, how long the others may run on (None: until
    #: the caller's ``settled`` holds, or ``idle`` passes without output).
    grace: float | None = None
    #: A ``time.monotonic()`` value past which the group is ended as ``budget``.
    deadline: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Child:
    """One child: its command, its whole environment, and where its output goes."""

    argv: Sequence[str]
    env: Mapping[str, str]
    #: Its stdout (and stderr, unless ``stderr`` is given), followed as it grows.
    log: Path
    stderr: Path | None = None
    #: How failures name it ("rank 1").
    name: str = ""


@dataclasses.dataclass
class ChildEnd:
    """How one child ended and what it said."""

    name: str
    returncode: int | None = None
    #: Still running when the group ended (ended by the supervisor, not by itself).
    stopped: bool = False
    #: ``time.monotonic()`` when its exit was seen (None: stopped).
    ended_at: float | None = None
    messages: list[wire.Message] = dataclasses.field(default_factory=list)

    def last(self, tag: str) -> object:
        """The data of its last ``tag`` message; None when it said none."""
        return next((m.data for m in reversed(self.messages) if m.tag == tag), None)

    def said(self, tag: str) -> bool:
        return any(m.tag == tag for m in self.messages)


@dataclasses.dataclass
class GroupOutcome:
    """How a group of processes ended."""

    ok: bool
    failure: str | None = None
    #: "crash", "hang", "fatal", "protocol" or "budget"
    kind: str | None = None
    #: The process whose exit ended the group (a "crash"), if one did.
    failed: int | None = None
    returncodes: list[int | None] = dataclasses.field(default_factory=list)
    tails: list[list[str]] = dataclasses.field(default_factory=list)
    children: list[ChildEnd] = dataclasses.field(default_factory=list)
    #: ``time.monotonic()`` when every child was ready (None: never).
    ready_at: float | None = None
    started_at: float = 0.0


class _Follower:
    """Reads a growing log file line by line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""
        self.tail: list[str] = []

    def poll(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        text = self.partial + chunk.decode("utf-8", "replace")
        lines = text.split("\n")
        self.partial = lines.pop()
        self.tail = (self.tail + lines)[-TAIL_LINES:]
        return lines

    def final(self) -> list[str]:
        """What is left, the unterminated last line included (the child has ended)."""
        lines = self.poll()
        if self.partial:
            lines.append(self.partial)
            self.tail = [*self.tail, self.partial][-TAIL_LINES:]
            self.partial = ""
        return lines


def _sigterm(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C inside the block (so a child the block waits on is
    ended with its group), unless the program already handles SIGTERM (the CLI's boundary
    does the same) or this is not the main thread (only it receives signals)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def ending_children() -> Iterator[None]:
    """A block that waits on children started in other threads (a pool of probes): Ctrl-C
    or SIGTERM there ends every running child with its group at once, so the threads'
    waits return (a pool's exit would otherwise wait for each child to finish), and goes
    on.  Children not yet started are refused (:func:`sm120fork.util.proc.end_children`)."""
    with sigterm_unwinds():
        try:
            yield
        except KeyboardInterrupt:
            proc.end_children()
            raise


def _exit_text(name: str, code: int) -> str:
    return f"{name} exited with code {code}" + (f" (signal {-code})" if code < 0 else "")


def run_group(children: Sequence[Child], *, timeouts: Timeouts,
              on_line: Callable[[int, str], None] | None = None,
              on_message: Callable[[int, wire.Message], None] | None = None,
              ready: str | None = None, fail_fast: bool = True,
              settled: Callable[[list[int | None]], bool] | None = None,
              poll_interval: float = 0.1) -> GroupOutcome:
    """Run ``children`` concurrently under ``timeouts``; how they ended.

    ``on_line`` sees every line of each child's log, ``on_message`` every wire message
    (after the supervisor read it: ``FATAL`` and ``ready`` included), both with the
    child's index.  With ``fail_fast``, the first child that exits non-zero ends the
    group once ``settled(returncodes)`` holds (the caller's judgement that the children
    still running have reported what the failed one had finished: a rank that reports
    its case and then exits must not cost the others their report of that case) or
    ``timeouts.grace`` has passed.

    Each round reads the exit codes *before* the logs, so whatever a child printed
    before it exited is seen in the same round as its exit."""
    names = [c.name or f"rank {i}" for i, c in enumerate(children)]
    ends = [ChildEnd(name=n) for n in names]
    followers = [_Follower(c.log) for c in children]
    outcome = GroupOutcome(ok=False, children=ends, started_at=time.monotonic())
    spoken = [False] * len(children)
    problem: list[str] = []   # the first line that did not decode, with its child

    def take(idx: int, line: str) -> None:
        spoken[idx] = True
        if on_line:
            on_line(idx, line)
        try:
            message = wire.decode(line)
        except wire.WireError as exc:
            problem.append(f"{names[idx]}: {exc}")
            return
        if message is None:
            return
        ends[idx].messages.append(message)
        if on_message:
            on_message(idx, message)

    with sigterm_unwinds(), proc.ProcessGroup() as group:
        for child in children:
            child.log.parent.mkdir(parents=True, exist_ok=True)
            with child.log.open("wb") as out:
                if child.stderr is None:
                    group.start(child.argv, env=child.env, stdout=out)
                else:
                    with child.stderr.open("wb") as err:
                        group.start(child.argv, env=child.env, stdout=out, stderr=err)
        procs = group.procs
        started = last = outcome.started_at
        failed_since: float | None = None
        try:
            while True:
                codes = [p.poll() for p in procs]
                now = time.monotonic()
                for idx, code in enumerate(codes):
                    if code is not None and ends[idx].ended_at is None:
                        ends[idx].ended_at = now
                for idx, follower in enumerate(followers):
                    for line in follower.poll():
                        last = time.monotonic()
                        take(idx, line)
                now = time.monotonic()
                fatal = next((f"{names[i]}: {m.data}" for i, e in enumerate(ends)
                              for m in e.messages if m.tag == "FATAL"), None)
                if problem and fail_fast:
                    outcome.failure, outcome.kind = problem[0], "protocol"
                    break
                if fatal and fail_fast:
                    outcome.failure, outcome.kind = fatal, "fatal"
                    break
                if outcome.ready_at is None and all(
                        (e.said(ready) if ready else spoken[i] or codes[i] is not None)
                        for i, e in enumerate(ends)):
                    outcome.ready_at = now
                failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
                if failed and failed_since is None:
                    failed_since = now
                if failed and fail_fast and failed_since is not None and (
                        None not in codes
                        or (timeouts.grace is not None and now - failed_since > timeouts.grace)
                        or (timeouts.grace is None and (
                            settled is None or settled(codes)
                            or (timeouts.idle is not None and now - last > timeouts.idle)))):
                    i, c = failed[0]
                    outcome.failure = _exit_text(names[i], c)
                    outcome.kind, outcome.failed = "crash", i
                    break
                if all(c is not None for c in codes):
                    outcome.ok = not failed
                    if failed:
                        outcome.failure = "; ".join(f"process {i} exited with code {c}"
                                                    for i, c in failed)
                        outcome.kind = "crash"
                    break
                if timeouts.deadline is not None and now > timeouts.deadline:
                    outcome.failure, outcome.kind = "time budget exhausted", "budget"
                    break
                stuck = [i for i, c in enumerate(codes) if c is None]
                quiet = now - last
                if outcome.ready_at is None:
                    starting = (ready is not None or any(
                        not s and c is None for s, c in zip(spoken, codes, strict=True)))
                    limit = timeouts.startup if starting else timeouts.idle
                    since = started if starting else last
                    if limit is not None and now - since > limit and (
                            timeouts.idle is None or quiet > timeouts.idle):
                        outcome.failure = (f"watchdog: no output for {limit:.0f} s; ranks "
                                           f"still running: {stuck}" if not ready else
                                           f"watchdog: not ready within {limit:.0f} s; still "
                                           f"running: {[names[i] for i in stuck]}")
                        outcome.kind = "hang"
                        break
                else:
                    if timeouts.idle is not None and quiet > timeouts.idle:
                        outcome.failure = (f"watchdog: no output for {timeouts.idle:.0f} s; "
                                           f"ranks still running: {stuck}")
                        outcome.kind = "hang"
                        break
                    if timeouts.run is not None and now - outcome.ready_at > timeouts.run:
                        outcome.failure = (f"watchdog: not finished {timeouts.run:.0f} s after "
                                           f"every child was ready; still running: "
                                           f"{[names[i] for i in stuck]}")
                        outcome.kind = "hang"
                        break
                time.sleep(poll_interval)
        finally:
            now = time.monotonic()
            for idx, p in enumerate(procs):
                ends[idx].stopped = p.poll() is None
                if not ends[idx].stopped and ends[idx].ended_at is None:
                    ends[idx].ended_at = now
            group.kill()
            for idx, follower in enumerate(followers):
                for line in follower.final():
                    take(idx, line)
    if problem and outcome.kind in (None, "crash"):
        outcome.ok, outcome.failure, outcome.kind = False, problem[0], "protocol"
    for idx, p in enumerate(procs):
        ends[idx].returncode = p.returncode
    outcome.returncodes = [p.returncode for p in procs]
    outcome.tails = [f.tail[-TAIL_LINES:] for f in followers]
    return outcome
