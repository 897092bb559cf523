"""A bump in progress (``.forks/bump/<stack>--<project>/state.json``) and its verdicts."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120fork.workspace import Workspace

BEFORE_REF = "refs/sm120fork/before-bump"
BEFORE_BASE_REF = "refs/sm120fork/before-bump-base"

STILL_NEEDED = "still needed"
UPSTREAMED_IDENTICALLY = "upstreamed identically"
UPSTREAMED_DIFFERENTLY = "upstreamed differently"
CONFLICT = "conflict"
RESOLVED = "conflict, resolved by hand"
DROPPED_BY_HAND = "conflict, dropped by hand"
UPSTREAMED = (UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY)


def today() -> str:
    return os.environ.get("SM120FORK_TODAY") or dt.datetime.now(dt.UTC).date().isoformat()


@dataclass(frozen=True, kw_only=True)
class Classification:
    patch: str
    subject: str
    verdict: str
    evidence: tuple[str, ...]
    applied_upstream: str

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "evidence": list(self.evidence)}


@dataclass
class BumpState:
    """A bump in progress, in ``.forks/bump/<stack>--<project>/state.json``."""

    stack: str
    project: str
    old_version: str
    new_version: str
    new_pin: dict[str, Any]
    created_stack: bool
    declaration: str
    series_dir: str
    results: list[dict[str, Any]]
    next_index: int = 0
    head: str = ""
    conflict_head: str = ""
    conflict_evidence: list[str] = dataclasses.field(default_factory=list)
    phase: str = "classify"
    started: str = ""
    command: str = ""
    #: Every patch classified against the new upstream before any was applied.
    preview: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def classifications(self, which: str = "results") -> tuple[Classification, ...]:
        rows = self.preview if which == "preview" else self.results
        return tuple(Classification(**{**r, "evidence": tuple(r["evidence"])}) for r in rows)

    @staticmethod
    def directory(ws: Workspace, stack: str, project: str) -> Path:
        return ws.state_dir / "bump" / f"{stack}--{project}"

    @classmethod
    def load(cls, ws: Workspace, stack: str, project: str) -> BumpState | None:
        path = cls.directory(ws, stack, project) / "state.json"
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, ws: Workspace) -> None:
        d = self.directory(ws, self.stack, self.project)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "state.json.tmp"
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=1))
        tmp.replace(d / "state.json")

