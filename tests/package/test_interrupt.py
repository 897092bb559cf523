"""Interrupting is clean: child builds end, scratch folders go, one line says so; what
a hard kill leaves is removed by the next run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers_proc import alive, ended, pids_written, sleeping_hook
from sm120fork.errors import EXIT_INTERRUPTED, CommandError
from sm120fork.package.stack import remove_leftovers
from sm120fork.util import proc

from helpers_ws import STACK, DemoWorkspace, make_demo

_SLOW_BUILD = """
import sys, tempfile
from pathlib import Path
import sm120fork.package.kinds as kinds
from sm120fork.util import proc
from sm120fork.util.files import scratch_prefix

mark = Path(sys.argv[2])

def slow_wheel(project, repo, out_dir, **options):
    # What a real wheel build's worker thread holds when the run is interrupted.
    tempfile.mkdtemp(prefix=scratch_prefix(f"build-{project.key}", hidden=False))
    proc.run([sys.executable, "-c", "import os, sys, time; "
              "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)",
              f"{mark}.{project.key}"])
    raise AssertionError("the sleeper was not ended")

kinds.build_wheel = slow_wheel  # where the sdist kind builds
from sm120fork.cli.main import main
sys.exit(main(["--root", sys.argv[1], "build"]))
"""


def _start_slow_build(demo: DemoWorkspace, tmp_path: Path) -> tuple[subprocess.Popen[str],
                                                                     list[int]]:
    mark = tmp_path / "sleeping"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.Popen([sys.executable, "-c", _SLOW_BUILD, str(demo.ws.root), str(mark)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    marks = [Path(f"{mark}.{key}") for key in ("lib", "app")]
    for _ in range(1200):  # a hang guard, not a timing assertion
        if all(m.is_file() and m.read_text() for m in marks) or run.poll() is not None:
            break
        time.sleep(0.1)
    assert run.poll() is None, run.communicate()
    return run, [int(m.read_text()) for m in marks]


@pytest.mark.slow
def test_sigterm_to_the_toolkit_alone_ends_child_builds_and_cleans_up(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    run, sleepers = _start_slow_build(demo, tmp_path)
    assert [p for p in demo.ws.state_dir.iterdir() if p.name.startswith(".sm120fork-")]
    run.send_signal(signal.SIGTERM)  # as nox forwards it: to our process only
    _, err = run.communicate(timeout=120)
    assert run.returncode == EXIT_INTERRUPTED
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1
    assert lines[0].endswith("interrupted: build stopped, 2 running command(s) ended; its "
                             "temporary folders are removed")
    assert not any(alive(pid) for pid in sleepers)
    assert not list(Path(tempfile.gettempdir()).glob(f"sm120fork-{run.pid}-build-*"))
    assert not [p for p in demo.ws.state_dir.iterdir() if p.name.startswith(".sm120fork-")]
    assert not demo.ws.stack_wheels(STACK).exists()


@pytest.mark.slow
def test_what_a_hard_kill_leaves_is_removed_by_the_next_run(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    run, sleepers = _start_slow_build(demo, tmp_path)
    run.kill()
    run.communicate()
    for pid in sleepers:  # a SIGKILL ends nothing else: the test ends the orphans
        os.killpg(pid, signal.SIGKILL)
    left = [p for p in demo.ws.state_dir.iterdir() if p.name.startswith(".sm120fork-")]
    assert left
    mine = demo.ws.state_dir / f".sm120fork-{os.getpid()}-running-x"
    mine.mkdir()  # a live process's scratch folder stays
    remove_leftovers(demo.ws, demo.ws.stack(STACK))
    assert not any(p.exists() for p in left)
    assert mine.is_dir()


def test_ending_children_stops_a_running_command_and_refuses_new_ones() -> None:
    errors: list[CommandError] = []

    def sleeper() -> None:
        try:
            proc.run([sys.executable, "-c", "import time; time.sleep(600)"])
        except CommandError as exc:
            errors.append(exc)

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        for _ in range(600):
            with proc._children_lock:
                if proc._children:
                    break
            time.sleep(0.05)
        assert proc.end_children() == 1
        thread.join(60)
        assert not thread.is_alive()
        assert errors
        with pytest.raises(CommandError, match="being interrupted"):
            proc.run([sys.executable, "-c", "pass"])
    finally:
        proc.allow_children()
    assert proc.run([sys.executable, "-c", "print('ok')"]).stdout == "ok\n"


def test_ending_children_also_stops_a_running_git_am(tmp_path: Path) -> None:
    """git runs through the one runner: Ctrl-C ends a ``git am`` and what git started (here
    a hook that would sleep for ten minutes), not only the toolkit's own commands."""
    from sm120fork.util.git import Git

    repo = Git.init(tmp_path / "tree")
    (repo.path / "f.txt").write_text("one\n")
    repo("add", "f.txt")
    repo("commit", "-q", "-m", "one")
    (repo.path / "f.txt").write_text("two\n")
    repo("commit", "-q", "-am", "two")
    patch = tmp_path / "two.patch"
    patch.write_text(repo("format-patch", "--stdout", "HEAD~1", strip=False))
    repo("reset", "-q", "--hard", "HEAD~1")
    hook_pid = tmp_path / "hook.pid"
    sleeping_hook(repo.path / ".git", hook_pid)
    errors: list[CommandError] = []

    def am() -> None:
        try:
            repo("am", str(patch))
        except CommandError as exc:
            errors.append(exc)

    thread = threading.Thread(target=am)
    thread.start()
    try:
        (pid,) = pids_written(hook_pid)
        assert proc.end_children() == 1
        thread.join(60)
        assert not thread.is_alive()
        assert errors
        assert "git am" in errors[0].what
        assert ended(pid), "git am's hook still runs"
    finally:
        proc.allow_children()


def test_one_process_runner() -> None:
    """Only util/proc.py starts or ends processes: the doctor's too (the plugin wheel
    carries util/proc.py beside the doctor).  The one other is the offline kit's entry,
    kit/boot.py: it runs on the GPU box before the toolkit is installed (it installs it),
    from the kit's folder with the standard library alone."""
    src = Path(__file__).resolve().parents[2] / "src" / "sm120fork"
    starts = re.compile(r"subprocess\.(Popen|run|call|check_call|check_output)\(|os\.killpg\(|"
                        r"start_new_session")
    hits = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                  if starts.search(p.read_text(encoding="utf-8")))
    assert hits == ["kit/boot.py", "util/proc.py"]


def test_a_process_group_is_ended_whole_by_ctrl_c_and_by_its_with_block(tmp_path: Path) -> None:
    """GPU ranks and the layer harness's ranks run in a ProcessGroup: end_children (Ctrl-C)
    ends them and what they started; leaving the block kills whatever still runs."""
    child = ("import subprocess, sys, time; "
             "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
             "open(sys.argv[1], 'w').write(str(g.pid)); time.sleep(600)")
    marks = [tmp_path / "a", tmp_path / "b"]
    try:
        with proc.ProcessGroup() as group:
            for mark in marks:
                group.start([sys.executable, "-c", child, str(mark)], env=os.environ,
                            stdout=subprocess.DEVNULL)
            grandchildren = pids_written(*marks)
            assert proc.end_children() == 2
            assert group.poll() == [-signal.SIGTERM, -signal.SIGTERM]
        for pid in grandchildren:
            assert ended(pid)
    finally:
        proc.allow_children()
    with proc.ProcessGroup() as group:
        sleeper = group.start([sys.executable, "-c", "import time; time.sleep(600)"],
                              env=os.environ)
    assert sleeper.returncode == -signal.SIGKILL
