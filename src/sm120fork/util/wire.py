"""The one wire format between the toolkit and its children: ``@@sm120fork/1 TAG <json>``
lines amid ordinary output.  A marked line that is not a whole message of this version is
a :class:`WireError`, never dropped.  Stdlib only."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from ..errors import CommandError

MARK = "@@sm120fork/"
VERSION = 1
_TAG = re.compile(r"[A-Z][A-Z0-9_]*\Z")


class WireError(CommandError):
    pass


@dataclass(frozen=True)
class Message:
    tag: str
    data: Any = None


def encode(tag: str, data: Any = None) -> str:
    if not _TAG.match(tag):
        raise ValueError(f"a wire tag is upper case: {tag!r}")
    return f"{MARK}{VERSION} {tag} {json.dumps(data)}"


def decode(line: str) -> Message | None:
    """None for ordinary output."""
    text = line.rstrip("\r\n")
    if not text.startswith(MARK):
        return None
    head, _, rest = text[len(MARK):].partition(" ")
    shown = text if len(text) <= 200 else text[:200] + "..."
    if head != str(VERSION):
        raise WireError(f"wire format version {head!r} in {shown!r}; this toolkit reads "
                        f"version {VERSION}",
                        fix="run the child from the same checkout as the toolkit")
    tag, _, payload = rest.partition(" ")
    if not _TAG.match(tag):
        raise WireError(f"no tag in wire line {shown!r}")
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise WireError(f"the {tag} message is not one JSON value ({exc.msg}): {shown!r}"
                        ) from None
    return Message(tag, data)


def say(tag: str, data: Any = None, *, stream: TextIO | None = None) -> None:
    """Flushed: a child about to hang or crash has still said it."""
    out = stream if stream is not None else sys.stdout
    out.write(encode(tag, data) + "\n")
    out.flush()


def last(text: str, tag: str) -> Any:
    """The data of the last ``tag`` message in ``text``; None when it said none."""
    found: Any = None
    for line in text.splitlines():
        message = decode(line)
        if message is not None and message.tag == tag:
            found = message.data
    return found
