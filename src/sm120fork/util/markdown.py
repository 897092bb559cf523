"""The one markdown-table writer for reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A GitHub-flavoured table's lines; ``|`` in cells is escaped, newlines become spaces."""
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out
