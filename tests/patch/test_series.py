from __future__ import annotations

from pathlib import Path

import pytest

from sm120fork.errors import SeriesError
from sm120fork.patch.series import load_series

from helpers_ws import make_demo

REPO = Path(__file__).resolve().parents[2]


def test_demo_series_parses(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    series = load_series(demo.series_dir("lib"))
    assert [p.subject for p in series.patches] == ["F1 gate: allow 12",
                                                   "F3 guards: drop the 1200 exclusion"]
    first = series.patches[0]
    assert first.field("Origin") == "vendor, test"
    assert str(first.fingerprints[0]) == "demo_lib/__init__.py: return [9, 10, 12]"
    assert first.files == ("demo_lib/__init__.py",)


def test_order_comes_from_series_file(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    d = demo.series_dir("lib")
    names = (d / "series").read_text().split()
    (d / "series").write_text("# reversed\n\n" + "\n".join(reversed(names)) + "\n")
    assert load_series(d).names() == list(reversed(names))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: (d / "series").write_text("0001-x.patch\n"), "listed in series but missing"),
    (lambda d: (d / "9999-stray.patch").write_text("x"), "not listed in series: 9999-stray"),
    (lambda d: (d / "series").unlink(), "no series file"),
])
def test_series_disagreeing_with_disk(tmp_path: Path, mutate: object, message: str) -> None:
    demo = make_demo(tmp_path)
    d = demo.series_dir("lib")
    mutate(d)  # type: ignore[operator]
    with pytest.raises(SeriesError, match=message):
        load_series(d)


@pytest.mark.parametrize(("old", "new", "message"), [
    ("Forwarded: no\n", "", "lacks 'Forwarded'"),
    ("Last-Update: 2026-11-29", "Last-Update: yesterday", "not YYYY-MM-DD"),
    ("Fingerprint: demo_lib/__init__.py: return [9, 10, 12]", "Fingerprint: nothing",
     "malformed Fingerprint"),
    ("Fingerprint: demo_lib/__init__.py:", "Fingerprint: demo_lib/other.py:",
     "which the patch does not change"),
])
def test_bad_headers(tmp_path: Path, old: str, new: str, message: str) -> None:
    demo = make_demo(tmp_path)
    d = demo.series_dir("lib")
    patch = d / (d / "series").read_text().split()[0]
    assert old in patch.read_text()
    patch.write_text(patch.read_text().replace(old, new))
    with pytest.raises(SeriesError, match=message):
        load_series(d)


@pytest.mark.parametrize("project", ["flashinfer", "sglang"])
def test_shipped_series_are_well_formed(project: str) -> None:
    d = REPO / "patches" / "sglang-0.5.10" / project
    series = load_series(d)
    assert series.patches
    for p in series.patches:
        assert p.field("Origin")
        assert p.field("Forwarded")


def test_a_reworded_description_keeps_the_patch_id_a_changed_line_does_not(
        tmp_path: Path) -> None:
    """Evidence is keyed on the change, not its commentary (issue 29)."""
    demo = make_demo(tmp_path)
    d = demo.series_dir("lib")
    before = load_series(d)
    first = before.patches[0]
    text = first.path.read_text()
    assert "Description: " in text
    first.path.write_text(text.replace("Description: ", "Description: Reworded. ", 1)
                          .replace("Forwarded: no", "Forwarded: not-needed"))
    reworded = load_series(d)
    assert reworded.digest != before.digest  # a build cache still sees new bytes
    assert reworded.patch_ids == before.patch_ids
    first.path.write_text(text.replace("return [9, 10, 12]", "return [9, 10, 12, 13]"))
    changed = load_series(d)
    assert changed.patches[0].patch_id != first.patch_id
    assert changed.patches[1].patch_id == before.patches[1].patch_id
    assert len(first.patch_id) == 40


def test_a_patch_without_a_diff_has_no_patch_id() -> None:
    from sm120fork.patch.series import patch_id_of

    with pytest.raises(SeriesError, match="no diff"):
        patch_id_of(b"Subject: nothing\n\njust words\n", where="x.patch")
