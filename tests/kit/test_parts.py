"""A kit in parts (``--part-size``): each part within the limit, joined byte for byte on
the box by any part's entry, a missing or damaged part named before anything is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.errors import ConfigError
from sm120fork.kit import boot
from sm120fork.kit.build import RUN_SCRIPT, layout, write_parts

KIB = 1024


def _kit(folder: Path) -> Path:
    """A kit folder as build.make writes one, with a file larger than a part."""
    folder.mkdir(parents=True)
    for sub in ("stack", "wheels", "upstream"):
        (folder / sub).mkdir()
    (folder / "stack" / "big-1-py3-none-any.whl").write_bytes(os.urandom(280 * KIB + 7))
    (folder / "upstream" / "mid-1-py3-none-any.whl").write_bytes(os.urandom(90 * KIB))
    for i in range(12):
        (folder / "wheels" / f"w{i}-1-py3-none-any.whl").write_bytes(os.urandom(5 * KIB + i))
    (folder / "boot.py").write_bytes(Path(boot.__file__).read_bytes())
    (folder / boot.KIT_FILE).write_text(json.dumps({"format": boot.KIT_FORMAT}))
    run = folder / "run"
    run.write_text(RUN_SCRIPT.format(stack="s", python="3.12"))
    run.chmod(0o755)
    return folder


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _parts(tmp_path: Path, size: int = 128 * KIB) -> tuple[Path, list[Path]]:
    kit = _kit(tmp_path / "built")
    (tmp_path / "box").mkdir()
    written = write_parts(kit, tmp_path / "box" / "kit", size)
    return kit, [folder for folder, _ in written]


def test_parts_stay_within_the_size_and_join_byte_for_byte(tmp_path: Path) -> None:
    kit, parts = _parts(tmp_path)
    assert [p.name for p in parts] == [f"kit.{i}" for i in range(1, len(parts) + 1)]
    assert len(parts) == 5  # ~100 KiB for files: 280 KiB in three pieces, 90, 12 small
    for part in parts:
        assert sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) <= 128 * KIB
        assert os.access(part / "run", os.X_OK)
    # the big file is cut; the others travel whole
    pieces = sorted(p.name for part in parts for p in part.rglob("big-*"))
    assert pieces == [f"big-1-py3-none-any.whl.piece-{i}-of-3" for i in (1, 2, 3)]
    joined = boot.join(parts[-1], boot.read_parts(parts[-1]))
    assert joined == tmp_path / "box" / "kit"
    assert _tree(joined) == {**_tree(kit), boot.JOINED_FILE: _tree(joined)[boot.JOINED_FILE]}
    assert os.access(joined / "run", os.X_OK)
    assert not [p for p in (tmp_path / "box").iterdir() if p.name.startswith(".")]


def test_a_second_run_joins_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, parts = _parts(tmp_path)
    index = boot.read_parts(parts[0])
    joined = boot.join(parts[0], index)
    (joined / ".box").mkdir()  # the private venv made on the first run stays

    def no(*_: object) -> None:
        raise AssertionError("joined again")

    monkeypatch.setattr(boot, "check_parts", no)
    assert boot.join(parts[1], boot.read_parts(parts[1])) == joined
    assert (joined / ".box").is_dir()


def test_a_missing_part_is_named_in_one_line_by_the_entry(tmp_path: Path) -> None:
    """``sh DIR.N/run VERB`` stops before any venv is made or wheel installed."""
    _, parts = _parts(tmp_path)
    shutil.rmtree(parts[1])
    done = subprocess.run(["sh", parts[-1] / "run", "gpu_test", "--quick"],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == boot.EXIT_CONFIG
    assert done.stderr.splitlines() == [
        f"error: part kit.2 of {len(parts)} is missing: copy it beside "
        f"{tmp_path / 'box' / 'kit.1'}"]
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == sorted(
        p.name for p in parts if p.exists())


def test_a_damaged_part_is_named_with_its_file_and_nothing_is_left_joined(
        tmp_path: Path) -> None:
    _, parts = _parts(tmp_path)
    index = boot.read_parts(parts[0])
    entry = next(e for e in index.files if e.file == "stack/big-1-py3-none-any.whl")
    piece = entry.pieces[1]
    path = parts[piece.part - 1] / piece.path
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF  # one flipped byte, same size
    path.write_bytes(bytes(data))
    with pytest.raises(boot.KitError) as err:
        boot.join(parts[0], index)
    assert str(err.value) == (f"damaged part, sha256 does not match: kit.{piece.part} "
                              "(stack/big-1-py3-none-any.whl): copy those parts again")
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == [p.name for p in parts]
    # cut short (a copy that stopped midway): named without hashing anything
    path.write_bytes(bytes(data[:-10]))
    with pytest.raises(boot.KitError, match=rf"damaged part: kit\.{piece.part} "
                       r"\(stack/big-1-py3-none-any\.whl: wrong size\)"):
        boot.join(parts[0], index)


def test_a_part_of_another_build_is_refused(tmp_path: Path) -> None:
    _, parts = _parts(tmp_path)
    other = _kit(tmp_path / "other")
    (tmp_path / "elsewhere").mkdir()
    second = write_parts(other, tmp_path / "elsewhere" / "kit", 128 * KIB)
    shutil.rmtree(parts[2])
    shutil.copytree(second[2][0], parts[2])
    with pytest.raises(boot.KitError, match=r"part kit\.3 is from another kit"):
        boot.join(parts[0], boot.read_parts(parts[0]))


def test_a_renamed_part_says_it_must_keep_its_name(tmp_path: Path) -> None:
    _, parts = _parts(tmp_path)
    moved = parts[0].rename(tmp_path / "box" / "first")
    with pytest.raises(boot.KitError, match=r"must keep its name <kit>\.1"):
        boot.join(moved, boot.read_parts(moved))


def test_a_rebuild_in_fewer_parts_leaves_no_stale_part(tmp_path: Path) -> None:
    kit, parts = _parts(tmp_path, 64 * KIB)
    assert len(parts) > 4
    again = write_parts(kit, tmp_path / "box" / "kit", 128 * KIB)
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == [
        f"kit.{i}" for i in range(1, len(again) + 1)]


def test_layout_keeps_files_whole_where_they_fit() -> None:
    bins = layout({"a": 70, "b": 50, "c": 30, "d": 25, "e": 250}, 100)
    assert [[(p.file, p.index, p.size) for p in b] for b in bins] == [
        [("e", 1, 100)], [("e", 2, 100)], [("a", 1, 70), ("c", 1, 30)],
        [("b", 1, 50), ("e", 3, 50)], [("d", 1, 25)]]


def test_a_part_too_small_for_its_own_files_is_refused(tmp_path: Path) -> None:
    kit = _kit(tmp_path / "built")
    with pytest.raises(ConfigError, match="leaves no room") as err:
        write_parts(kit, tmp_path / "kit", 16 * KIB)
    assert err.value.where == "--part-size"


def test_a_join_the_disk_refuses_says_where_to_copy_the_parts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, parts = _parts(tmp_path)

    def full(*_: object) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(boot, "join", full)
    assert boot.main(["gpu_test"], kit=parts[0]) == boot.EXIT_CONFIG
    assert capsys.readouterr().err == (
        f"error: could not join the parts beside {parts[0]}: [Errno 28] No space left on "
        "device: copy them to a writable folder with room for the kit, then run again\n")


def test_a_part_whose_index_is_not_one_is_named_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A hand-edited or truncated ``kit.json`` of a part: the entry names the file and the
    key (it read the index by string keys and ended in a KeyError traceback)."""
    _, parts = _parts(tmp_path)
    index = json.loads((parts[0] / boot.KIT_FILE).read_text())
    del index["files"][0]["sha256"]
    (parts[0] / boot.KIT_FILE).write_text(json.dumps(index))
    assert boot.main(["gpu_test"], kit=parts[0]) == boot.EXIT_CONFIG
    assert capsys.readouterr().err.splitlines() == [
        f"error: {parts[0] / boot.KIT_FILE}: not a kit part (sha256 is not a string)"]
