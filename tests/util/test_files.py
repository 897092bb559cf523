"""Folder swaps (``staged_dir``): the new folder whole, or the old one untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sm120fork.util import files
from sm120fork.util.files import remove_stale_scratch, staged_dir


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _old(dest: Path) -> dict[str, bytes]:
    (dest / "sub").mkdir(parents=True)
    (dest / "a.txt").write_bytes(b"old a")
    (dest / "sub" / "gone.txt").write_bytes(b"old only")
    return _tree(dest)


@pytest.fixture(params=[True, False], ids=["renameat2", "rename-aside"])
def swap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways replace_dir swaps: one exchange, or the old folder renamed aside first."""
    if not request.param:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)


@pytest.mark.usefixtures("swap")
def test_the_new_folder_replaces_the_old_as_a_whole(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    _old(dest)
    with staged_dir(dest) as new:
        new.mkdir()
        (new / "a.txt").write_bytes(b"new a")
        (new.parent / "scratch.tmp").write_bytes(b"not published")
        assert _tree(dest)["a.txt"] == b"old a"  # nothing shows before the block ends
    assert _tree(dest) == {"a.txt": b"new a"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # scratch and old folder gone


def test_a_missing_folder_is_made(tmp_path: Path) -> None:
    dest = tmp_path / "not" / "yet"
    with staged_dir(dest) as new:
        new.mkdir()
        (new / "x").write_text("x")
    assert _tree(dest) == {"x": b"x"}
    assert [p.name for p in dest.parent.iterdir()] == ["yet"]


@pytest.mark.usefixtures("swap")
def test_a_failing_block_leaves_the_old_folder_intact_and_a_rerun_replaces_it(
        tmp_path: Path) -> None:
    dest = tmp_path / "out"
    before = _old(dest)

    def fill(new: Path, *, fail: bool) -> None:
        new.mkdir()
        (new / "a.txt").write_bytes(b"new a")
        if fail:
            raise OSError("disk full")
        (new / "b.txt").write_bytes(b"new b")

    with pytest.raises(OSError, match="disk full"), staged_dir(dest) as new:
        fill(new, fail=True)
    assert _tree(dest) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    for _ in range(2):  # the rerun after the failure, then the same run again
        with staged_dir(dest) as new:
            fill(new, fail=False)
        assert _tree(dest) == {"a.txt": b"new a", "b.txt": b"new b"}
        assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.usefixtures("swap")
def test_a_block_that_makes_no_folder_fails_and_keeps_the_old(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    before = _old(dest)
    with pytest.raises(FileNotFoundError), staged_dir(dest):
        pass
    assert _tree(dest) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


_KILLED = """\
import sys, time
from pathlib import Path
from sm120fork.util.files import staged_dir
dest, mark = Path(sys.argv[1]), Path(sys.argv[2])
with staged_dir(dest) as new:
    new.mkdir()
    (new / "a.txt").write_text("half")
    mark.write_text("staged")
    time.sleep(600)
"""


def test_what_a_killed_run_leaves_is_removed_and_the_old_folder_stays(tmp_path: Path) -> None:
    dest = tmp_path / "parent" / "out"
    before = _old(dest)
    mark = tmp_path / "mark"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", _KILLED, str(dest), str(mark)], env=env)
    try:
        for _ in range(600):  # a hang guard, not a timing assertion
            if mark.is_file() or child.poll() is not None:
                break
            time.sleep(0.1)
        assert child.poll() is None
        assert mark.is_file()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    left = [p for p in dest.parent.iterdir() if p != dest]
    assert len(left) == 1
    assert left[0].name.startswith(f".sm120fork-{child.pid}-out-")
    assert _tree(dest) == before
    mine = dest.parent / f".sm120fork-{os.getpid()}-out-running"
    mine.mkdir()  # a live run's staging is not a leftover
    assert remove_stale_scratch(dest.parent) == left
    assert sorted(p.name for p in dest.parent.iterdir()) == [mine.name, "out"]
    assert _tree(dest) == before


def test_a_folder_is_made_once_per_digest_and_remade_whole_for_another(
        tmp_path: Path) -> None:
    """``made_once``: the same digest finds the folder made; another makes it again from
    nothing; a make that fails leaves the folder and its stamp as they were."""
    dest = tmp_path / "parent" / "out"
    made: list[str] = []

    def make(text: str) -> Callable[[Path], None]:
        def fill(new: Path) -> None:
            made.append(text)
            new.mkdir()
            (new / f"{text}.txt").write_text(text)
        return fill

    assert files.made_once(dest, "d1", make("one")) == dest
    assert files.made_once(dest, "d1", make("two")) == dest
    assert made == ["one"]
    files.made_once(dest, "d2", make("two"))
    assert sorted(p.name for p in dest.iterdir()) == [files.STAMP, "two.txt"]

    def fail(new: Path) -> None:
        new.mkdir()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        files.made_once(dest, "d3", fail)
    assert sorted(p.name for p in dest.iterdir()) == [files.STAMP, "two.txt"]
    files.made_once(dest, "d2", make("three"))
    assert made == ["one", "two"]
    assert [p.name for p in dest.parent.iterdir()] == ["out"]  # no scratch left
