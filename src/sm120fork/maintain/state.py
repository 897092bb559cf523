"""A bump in progress (``.forks/bump/<stack>--<project>/state.json``) and its verdicts."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import os
import shutil
from collections.abc import Callable, Iterable
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
#: A file the patch changes is not in the new release: a conflict of its own kind.
TARGET_MISSING = "target file missing"
RESOLVED = "conflict, resolved by hand"
DROPPED_BY_HAND = "conflict, dropped by hand"
UPSTREAMED = (UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY)


#: Called with the name of each step a bump reaches (tests interrupt a bump there).
stage_hook: Callable[[str], None] | None = None


def stage(name: str) -> None:
    """A bump reached step ``name``: everything before it is saved."""
    if stage_hook is not None:
        stage_hook(name)


def today() -> str:
    return os.environ.get("SM120FORK_TODAY") or dt.datetime.now(dt.UTC).date().isoformat()


@dataclass(frozen=True, kw_only=True)
class Classification:
    patch: str
    subject: str
    verdict: str
    evidence: tuple[str, ...]
    applied_upstream: str

    @classmethod
    def from_json(cls, data: object) -> Classification:
        """A row of ``state.json``; TypeError when it is not one."""
        if not isinstance(data, dict):
            raise TypeError(f"a classification is an object, not {type(data).__name__}")
        row = cls(**data)
        if not all(isinstance(v, str) for v in (row.patch, row.subject, row.verdict,
                                                row.applied_upstream)):
            raise TypeError(f"a classification of {row.patch!r} has a field not a string")
        return dataclasses.replace(row, evidence=tuple(map(str, row.evidence)))


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
    results: list[Classification]
    next_index: int = 0
    head: str = ""
    conflict_head: str = ""
    conflict_evidence: list[str] = dataclasses.field(default_factory=list)
    phase: str = "classify"
    started: str = ""
    command: str = ""
    #: The stack a ``--new-stack`` bump copies (its pins are the starting point).
    source_stack: str = ""
    #: Coordinated projects with patches, bumped (each as a bump of its own) to the
    #: version the new release pins before this one goes on: key -> version.
    companion_bumps: dict[str, str] = dataclasses.field(default_factory=dict)
    #: For such a bump: the project whose bump moves this one (pins agree once it ends).
    coordinated_with: str = ""
    #: Every patch classified against the new upstream before any was applied.
    preview: list[Classification] = dataclasses.field(default_factory=list)
    #: The journal ``--abort`` restores from: each file the bump may write (relative to
    #: the checkout) -> its bytes before (base64), or None where there was no file.
    before: dict[str, str | None] = dataclasses.field(default_factory=dict)
    #: Folders whose files the journal holds whole: a file not in it is removed on abort.
    journaled_dirs: list[str] = dataclasses.field(default_factory=list)

    def classifications(self, which: str = "results") -> tuple[Classification, ...]:
        return tuple(self.preview if which == "preview" else self.results)

    @staticmethod
    def directory(ws: Workspace, stack: str, project: str) -> Path:
        return ws.state_dir / "bump" / f"{stack}--{project}"

    @classmethod
    def load(cls, ws: Workspace, stack: str, project: str) -> BumpState | None:
        path = cls.directory(ws, stack, project) / "state.json"
        try:
            state = cls(**json.loads(path.read_text()))
            state.results = [Classification.from_json(r) for r in state.results]
            state.preview = [Classification.from_json(r) for r in state.preview]
        except (OSError, ValueError, TypeError):
            return None
        return state

    def save(self, ws: Workspace) -> None:
        d = self.directory(ws, self.stack, self.project)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "state.json.tmp"
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=1))
        tmp.replace(d / "state.json")



def journal(root: Path, files: Iterable[Path], dirs: Iterable[Path]) -> tuple[
        dict[str, str | None], list[str]]:
    """The bytes of ``files`` and of every file under ``dirs`` (None: not there), keyed by
    their path relative to ``root``: what :func:`restore` puts back."""
    before: dict[str, str | None] = {}
    for path in [*files, *(f for d in dirs if d.is_dir() for f in sorted(d.rglob("*"))
                           if f.is_file())]:
        before[path.relative_to(root).as_posix()] = (
            base64.b64encode(path.read_bytes()).decode("ascii") if path.is_file() else None)
    return before, [d.relative_to(root).as_posix() for d in dirs]


def restore(root: Path, before: dict[str, str | None], dirs: Iterable[str], *,
            last: Iterable[str] = ()) -> None:
    """Put every journaled file back byte for byte (``last`` after all others): a file
    that was not there is removed, and so is a file under a journaled folder the journal
    does not hold; a folder that did not exist is removed."""
    for d in dirs:
        folder = root / d
        if not folder.is_dir():
            continue
        if not any(v is not None and k.startswith(f"{d}/") for k, v in before.items()):
            shutil.rmtree(folder)
            continue
        for f in sorted(folder.rglob("*"), reverse=True):
            rel = f.relative_to(root).as_posix()
            if f.is_file() and rel not in before:
                f.unlink()
            elif f.is_dir() and not any(f.iterdir()):
                f.rmdir()
    late = set(last)
    for rel in sorted(before, key=lambda r: r in late):
        data, path = before[rel], root / rel
        if data is None:
            path.unlink(missing_ok=True)
            continue
        content = base64.b64decode(data)
        if path.is_file() and path.read_bytes() == content:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.sm120fork-restore")
        tmp.write_bytes(content)
        tmp.replace(path)
