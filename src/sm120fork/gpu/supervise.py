"""Process groups under a watchdog: start them, follow their logs, end them as a whole.

The processes are started and ended by the one runner's :class:`~sm120fork.util.proc.ProcessGroup`;
this module is the watchdog's policy.

A group ends when a process exits with an error, prints a ``@@FATAL`` line, stays silent
too long, or runs past a deadline; how it ended is returned, never raised.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sm120fork.gpu import protocol
from sm120fork.util import proc

TAIL_LINES = 25


@dataclasses.dataclass
class GroupOutcome:
    """How a group of processes ended."""

    ok: bool
    failure: str | None = None
    kind: str | None = None  # "crash", "hang" or "fatal"
    #: The process whose exit ended the group (a "crash"), if one did.
    failed: int | None = None
    returncodes: list[int | None] = dataclasses.field(default_factory=list)
    tails: list[list[str]] = dataclasses.field(default_factory=list)


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

    def final_tail(self) -> list[str]:
        return (self.tail + ([self.partial] if self.partial else []))[-TAIL_LINES:]


def run_group(commands: Sequence[Sequence[str]], *, envs: Sequence[Mapping[str, str]],
              log_paths: Sequence[Path], idle_timeout: float, first_timeout: float,
              on_line: Callable[[int, str], None] | None = None, fail_fast: bool = True,
              poll_interval: float = 0.1, deadline: float | None = None,
              settled: Callable[[list[int | None]], bool] | None = None) -> GroupOutcome:
    """Run ``commands`` concurrently under a watchdog.

    ``first_timeout`` bounds the time to each process's first output line (a rank that
    starts slower than the others, e.g. on a loaded machine, is not a hang while it does),
    ``idle_timeout`` the time between lines once every running process has spoken.  With
    ``fail_fast``, the first process that exits non-zero (or a ``@@FATAL`` line) ends the
    whole group, once ``settled(returncodes)`` holds: the caller's judgement that the
    processes still running have reported what the failed one had finished (a rank that
    reports its case and then exits must not cost the others their report of that same
    case); without output for ``idle_timeout`` it is ended anyway.  Past ``deadline`` (a
    ``time.monotonic()`` value) the group is ended as "budget".

    Each round reads the exit codes *before* the logs, so whatever a process printed
    before it exited is seen in the same round as its exit."""
    group = proc.ProcessGroup()
    procs = group.procs
    followers = [_Follower(p) for p in log_paths]
    for cmd, env, path in zip(commands, envs, log_paths, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            group.start(cmd, env=env, stdout=out)
    spoken = [False] * len(procs)
    started = last = time.monotonic()
    outcome = GroupOutcome(ok=False)
    fatal: str | None = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            for idx, follower in enumerate(followers):
                for line in follower.poll():
                    spoken[idx] = True
                    last = time.monotonic()
                    parsed = protocol.parse(line)
                    if parsed and parsed[0] == "FATAL":
                        fatal = fatal or f"rank {idx}: {parsed[1]}"
                    if on_line:
                        on_line(idx, line)
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if fatal and fail_fast:
                outcome.failure, outcome.kind = fatal, "fatal"
                break
            if failed and fail_fast and (
                    settled is None or settled(codes) or None not in codes
                    or time.monotonic() - last > idle_timeout):
                i, c = failed[0]
                outcome.failure = f"rank {i} exited with code {c}" + (
                    f" (signal {-c})" if c is not None and c < 0 else "")
                outcome.kind, outcome.failed = "crash", i
                break
            if all(c is not None for c in codes):
                outcome.ok = not failed
                if failed:
                    outcome.failure = "; ".join(f"process {i} exited with code {c}"
                                                for i, c in failed)
                    outcome.kind = "crash"
                break
            if deadline is not None and time.monotonic() > deadline:
                outcome.failure, outcome.kind = "time budget exhausted", "budget"
                break
            starting = any(not s and c is None for s, c in zip(spoken, codes, strict=True))
            now = time.monotonic()
            limit = first_timeout if starting else idle_timeout
            if now - (started if starting else last) > limit and now - last > idle_timeout:
                stuck = [i for i, c in enumerate(codes) if c is None]
                outcome.failure = (f"watchdog: no output for {limit:.0f} s; ranks still running: "
                                   f"{stuck}")
                outcome.kind = "hang"
                break
            time.sleep(poll_interval)
    finally:
        group.kill()
        for idx, follower in enumerate(followers):
            for line in follower.poll():
                if on_line:
                    on_line(idx, line)
    outcome.returncodes = [p.returncode for p in procs]
    outcome.tails = [f.final_tail() for f in followers]
    return outcome

