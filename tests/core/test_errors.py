"""Errors: a bug is never turned into a table cell; every exit code is declared once."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120fork import errors
from sm120fork.errors import SeriesError
from sm120fork.maintain import status as status_mod

from helpers_ws import make_demo


def test_every_error_class_has_its_own_exit_code() -> None:
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.ToolkitError)]
    codes = [c.exit_code for c in classes if c is not errors.ToolkitError]
    assert len(codes) == len(set(codes))
    assert errors.EXIT_INTERRUPTED not in codes


def test_status_shows_a_toolkit_error_in_its_row_but_lets_a_bug_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = make_demo(tmp_path)

    def bad_series(directory: Path) -> None:
        raise SeriesError("no series file", where=str(directory))

    from sm120fork import resolved

    # status reads the series through the stack it resolves (ResolvedStack): a series
    # that does not load is an error in its row
    monkeypatch.setattr(resolved, "load_series", bad_series)
    rows = status_mod.status(demo.ws)
    assert all("no series file" in r.error for r in rows)

    def bug(directory: Path) -> None:
        raise TypeError("a bug in the toolkit")

    monkeypatch.setattr(resolved, "load_series", bug)
    with pytest.raises(TypeError, match="a bug in the toolkit"):
        status_mod.status(demo.ws)
