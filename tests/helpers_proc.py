"""Waiting on the processes a test starts: the pid a child writes, a process that must end,
and a ``git am`` hook that sleeps until it is ended."""

from __future__ import annotations

import os
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pids_written(*marks: Path) -> list[int]:
    """The pids children write into ``marks``, once all are there (a hang guard, not a
    timing assertion)."""
    for _ in range(1200):
        if all(m.is_file() and m.read_text().strip() for m in marks):
            break
        time.sleep(0.05)
    return [int(m.read_text()) for m in marks]


def ended(pid: int) -> bool:
    """Whether ``pid`` ends within ten seconds."""
    for _ in range(200):
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def sleeping_hook(git_dir: Path, pid_file: Path) -> None:
    """An ``applypatch-msg`` hook that writes its pid to ``pid_file`` and sleeps ten
    minutes: what ``git am`` started, for a test that ends it."""
    hook = git_dir / "hooks" / "applypatch-msg"
    hook.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    hook.chmod(0o755)
