"""Waiting on the processes a test starts: the pid a child writes, a process that must end,
and a ``git am`` hook that sleeps until it is ended."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by whoever inherited it,
    does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


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


#: A child that starts a grandchild (``sleep``) in its own process group, writes both pids
#: into ``$SM120FORK_TEST_MARKS/<pid>.pids`` and hangs: what a stuck rank or probe leaves.
HANGING_CHILD = """\
import os, subprocess, sys, time
grandchild = subprocess.Popen(["sleep", "600"])
marks = os.environ["SM120FORK_TEST_MARKS"]
with open(os.path.join(marks, f"{os.getpid()}.tmp"), "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
os.rename(os.path.join(marks, f"{os.getpid()}.tmp"), os.path.join(marks, f"{os.getpid()}.pids"))
time.sleep(600)
"""


def sigterm_ends_every_child(parent: str, marks: Path, children: int) -> None:
    """Run ``parent`` (Python code that starts ``children`` copies of :data:`HANGING_CHILD`
    under a harness, with ``SM120FORK_TEST_MARKS=marks``), SIGTERM it once they all run,
    and assert that it ends and takes every child and grandchild with it."""
    import signal
    import subprocess
    import sys

    marks.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SM120FORK_TEST_MARKS": str(marks)}
    runner = subprocess.Popen([sys.executable, "-c", parent], env=env)
    try:
        for _ in range(1200):
            if len(list(marks.glob("*.pids"))) >= children or runner.poll() is not None:
                break
            time.sleep(0.05)
        pids = [int(p) for m in marks.glob("*.pids") for p in m.read_text().split()]
        assert len(pids) == 2 * children, f"the harness started {len(pids) // 2} children"
        runner.send_signal(signal.SIGTERM)
        runner.wait(60)
        left = [pid for pid in pids if not ended(pid)]
        assert not left, f"still running after SIGTERM to the harness: {left}"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        for m in marks.glob("*.pids"):
            for pid in map(int, m.read_text().split()):
                if alive(pid):
                    os.kill(pid, 9)


def module_python(tmp_path: Path, code: str) -> Path:
    """An "interpreter" whose ``-m MODULE ARGS...`` runs ``code`` with the real interpreter
    and ARGS (a fake rank or probe started the way the harness starts the real one)."""
    script = tmp_path / "fake_module.py"
    script.write_text(textwrap.dedent(code))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    return python
