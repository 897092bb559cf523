"""The one wire format and the one supervisor, with real child processes."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers_proc import HANGING_CHILD, sigterm_ends_every_child
from sm120fork.util import proc, wire


def test_a_message_reads_back_as_written() -> None:
    line = wire.encode("RESULT", {"key": "a/b", "status": "pass"})
    assert line.startswith(f"{wire.MARK}{wire.VERSION} RESULT ")
    assert wire.decode(line + "\n") == wire.Message("RESULT", {"key": "a/b", "status": "pass"})
    assert wire.decode(wire.encode("DONE")) == wire.Message("DONE", None)
    assert wire.decode("ordinary output @@sm120fork/1 START") is None


@pytest.mark.parametrize(("line", "says"), [
    ("@@sm120fork/2 RESULT {}", "version '2'"),
    ("@@sm120fork/1 RESULT {not json", "not one JSON value"),
    ("@@sm120fork/1 result {}", "no tag"),
])
def test_a_line_with_the_marker_that_does_not_decode_is_an_error(line: str, says: str) -> None:
    with pytest.raises(wire.WireError, match=says) as caught:
        wire.decode(line)
    assert line in str(caught.value)


def _child(tmp_path: Path, name: str, code: str) -> proc.Child:
    return proc.Child(argv=[sys.executable, "-c", textwrap.dedent(code)],
                           env={"PATH": "/usr/bin:/bin"}, log=tmp_path / f"{name}.log",
                           name=name)


def test_a_child_of_another_wire_version_is_named_with_its_line(tmp_path: Path) -> None:
    good = _child(tmp_path, "rank 0", "import time; print('up', flush=True); time.sleep(600)")
    old = _child(tmp_path, "rank 1", """\
        import time
        print('@@sm120fork/0 RESULT {"status": "pass"}', flush=True)
        time.sleep(600)""")
    started = time.monotonic()
    outcome = proc.run_group([good, old], timeouts=proc.Timeouts(startup=60, idle=60))
    assert outcome.kind == "protocol"
    assert outcome.failure is not None
    assert outcome.failure.startswith("rank 1: ")
    assert '@@sm120fork/0 RESULT {"status": "pass"}' in outcome.failure
    assert time.monotonic() - started < 30  # ended at once, not by a timeout
    assert all(end.stopped for end in outcome.children)


def test_messages_are_kept_per_child_and_ready_waits_for_every_child(tmp_path: Path) -> None:
    code = """\
        import sys, time
        from sm120fork.util.wire import say
        time.sleep(float(sys.argv[1]))
        say("READY")
        say("RESULT", {"n": sys.argv[1]})
        """
    kids = [proc.Child(argv=[sys.executable, "-c", textwrap.dedent(code), delay],
                            env={}, log=tmp_path / f"{delay}.log") for delay in ("0", "0.5")]
    outcome = proc.run_group(kids, timeouts=proc.Timeouts(startup=60, run=60),
                                  ready="READY")
    assert outcome.ok, outcome.failure
    assert [c.last("RESULT") for c in outcome.children] == [{"n": "0"}, {"n": "0.5"}]
    assert outcome.ready_at is not None
    assert all(c.ended_at is not None and not c.stopped for c in outcome.children)


@pytest.mark.parametrize("bound", ["startup", "run", "deadline"])
def test_each_bound_of_the_one_timeouts_object_ends_a_hanging_child(
        tmp_path: Path, bound: str) -> None:
    code = "from sm120fork.util.wire import say; import time; say('READY'); time.sleep(600)"
    if bound == "startup":
        code = "import time; time.sleep(600)"
    timeouts = {"startup": proc.Timeouts(startup=1.0),
                "run": proc.Timeouts(startup=60, run=1.0),
                "deadline": proc.Timeouts(deadline=time.monotonic() + 1.5)}[bound]
    kid = proc.Child(argv=[sys.executable, "-c", code], env={}, log=tmp_path / "k.log")
    started = time.monotonic()
    outcome = proc.run_group([kid], timeouts=timeouts, ready="READY")
    assert outcome.kind == ("budget" if bound == "deadline" else "hang"), outcome.failure
    assert outcome.children[0].stopped
    assert time.monotonic() - started < 30


def test_sigterm_to_the_parent_ends_every_child_with_its_group(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    parent = textwrap.dedent(f"""\
        import os, sys
        from pathlib import Path
        from sm120fork.util import proc
        kids = [proc.Child(argv=[sys.executable, "-c", {HANGING_CHILD!r}],
                                env=dict(os.environ), log=Path({str(tmp_path)!r}) / f"{{i}}.log")
                for i in range(2)]
        proc.run_group(kids, timeouts=proc.Timeouts())
        """)
    sigterm_ends_every_child(parent, marks, children=2)


def test_sigterm_while_waiting_on_a_pools_children_ends_them_at_once(tmp_path: Path) -> None:
    """A pool's exit waits for its threads: without ending their children first, SIGTERM
    to the parent would wait for each probe to finish."""
    parent = textwrap.dedent(f"""\
        import sys
        from concurrent.futures import ThreadPoolExecutor
        from sm120fork.util import proc
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(proc.run, [sys.executable, "-c", {HANGING_CHILD!r}],
                                   timeout=600) for _ in range(2)]
            with proc.ending_children():
                [f.result() for f in futures]
        """)
    started = time.monotonic()
    sigterm_ends_every_child(parent, tmp_path / "marks", children=2)
    assert time.monotonic() - started < 60
