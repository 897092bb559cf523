"""The line protocol between a rank process and the launcher.

A rank prints ordinary output freely; lines that start with ``@@`` carry data:
``@@START <key>`` before a case, ``@@RESULT <json>`` after it, ``@@BENCH <json>`` per
measurement, ``@@MODULE <json>`` per module built, ``@@ENV <json>`` once,
``@@FATAL <message>`` when the machine cannot run the work at all (retrying would not
help), ``@@DONE`` at a clean end.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "@@"


def emit(tag: str, payload: Any = None) -> str:
    """The line for ``tag`` (``payload``: a str, or anything JSON-serializable)."""
    if payload is None:
        return f"{PREFIX}{tag}"
    text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
    return f"{PREFIX}{tag} {text}"


def parse(line: str) -> tuple[str, Any] | None:
    """``(tag, payload)`` of a protocol line, None for ordinary output."""
    if not line.startswith(PREFIX):
        return None
    tag, _, rest = line[len(PREFIX):].rstrip("\n").partition(" ")
    if tag in {"RESULT", "BENCH", "ENV", "MODULE"}:
        try:
            return tag, json.loads(rest)
        except json.JSONDecodeError:
            return None
    return tag, rest
