"""What reports share: no absolute path of the machine that made them (a path under the
project root is relative, others are named by role: ``<out>``, ``<tmp>``, ``~``), and the
one markdown-table writer.  Stdlib only."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Roles = list[tuple[str, str]]


def machine_roles(root: Path, named: Mapping[str, Path | None] | None = None) -> Roles:
    """(absolute prefix, replacement) pairs, longest prefix first."""
    pairs: dict[str, str] = {}
    for where, label in [*((p, f"<{n}>") for n, p in (named or {}).items() if p is not None),
                         (Path(tempfile.gettempdir()), "<tmp>"), (Path(sys.prefix), "<python>"),
                         (Path(sys.base_prefix), "<python>"), (Path.home(), "~")]:
        for variant in {str(where), os.path.realpath(where)}:
            if variant not in ("", "/") and variant not in pairs:
                pairs[variant] = label
    for variant in {str(root), os.path.realpath(root)}:
        pairs[variant] = "."
    for path in list(pairs):  # a named path under the root is written relative to it
        for top in {str(root), os.path.realpath(root)}:
            if path != top and path.startswith(top + "/"):
                pairs[path] = os.path.relpath(path, top)
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def portable_text(text: str, roles: Roles) -> str:
    for prefix, label in roles:
        pattern = re.escape(prefix) + r"(?=/|\b|$)"
        if label == ".":  # "<root>/src/x" -> "src/x", "<root>" alone -> "."
            text = re.sub(re.escape(prefix) + "/", "", text)
            text = re.sub(pattern, ".", text)
        else:
            text = re.sub(pattern, label.replace("\\", r"\\"), text)
    return text


def portable(value: Any, roles: Roles | Callable[[str], str]) -> Any:
    """``value`` with each string's machine paths named by ``roles`` (or that function)."""
    if isinstance(value, str):
        return roles(value) if callable(roles) else portable_text(value, roles)
    if isinstance(value, list):
        return [portable(v, roles) for v in value]
    if isinstance(value, tuple):
        return tuple(portable(v, roles) for v in value)
    if isinstance(value, dict):
        return {k: portable(v, roles) for k, v in value.items()}
    return value


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A GitHub-flavoured table's lines; ``|`` in cells is escaped, newlines become spaces."""
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out
