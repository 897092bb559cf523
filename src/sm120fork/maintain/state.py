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

from sm120fork.declare import GitPin, Project, SdistPin, SourceKind, WheelPin
from sm120fork.errors import ConfigError, MaintenanceError
from sm120fork.patch.series import Series, load_series
from sm120fork.util import typed
from sm120fork.util.files import atomic_write_text, read_json_object
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

FORMAT = 2

STILL_NEEDED = "still needed"
UPSTREAMED_IDENTICALLY = "upstreamed identically"
UPSTREAMED_DIFFERENTLY = "upstreamed differently"
CONFLICT = "conflict"
TARGET_MISSING = "target file missing"
RESOLVED = "conflict, resolved by hand"
DROPPED_BY_HAND = "conflict, dropped by hand"
#: A merged or hand-resolved patch whose check fails, or could not run: the bump stops.
MERGED_FAILS_CHECK = "merged, fails its check"
MERGED_UNCHECKED = "merged, check could not run"
MERGES_UNCHECKED = "merges (3-way), not yet checked"
MERGED_3WAY = "merged by a 3-way merge"
CHECK_PASSES = "its check passes"
UPSTREAMED = (UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY)


#: Called with the name of each step a bump reaches (tests interrupt a bump there).
stage_hook: Callable[[str], None] | None = None


def stage(name: str) -> None:
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


@dataclass(frozen=True, kw_only=True)
class NewPin:
    """What a bump pins a project to: made by the pre-flight, kept in ``state.json``,
    written by :func:`sm120fork.maintain.pin.declaration_with_pin`."""

    source: SourceKind
    git: GitPin | None = None
    sdist: SdistPin | None = None
    #: The published wheels; None keeps the ones declared.
    wheels: tuple[WheelPin, ...] | None = None
    #: A coordinated project's new version.
    version: str = ""
    #: The new release's own requirements on the stack (None: not read, as for a commit).
    upstream_requires: tuple[str, ...] | None = None
    #: The layout that fits the new release ("" keeps the declared one).
    layout: str = ""
    #: Coordinated projects shipped as published: key -> their pin.
    companions: dict[str, NewPin] = dataclasses.field(default_factory=dict)


@dataclass
class BumpState:
    """A bump in progress, in ``.forks/bump/<stack>--<project>/state.json``."""

    stack: str
    project: str
    old_version: str
    new_version: str
    new_pin: NewPin
    created_stack: bool
    declaration: str
    series_dir: str
    results: list[Classification]
    next_index: int = 0
    head: str = ""
    conflict_head: str = ""
    conflict_evidence: list[str] = dataclasses.field(default_factory=list)
    #: The commit a 3-way merge made of the patch at ``conflict_head`` (not by hand).
    merged_head: str = ""
    #: Why the patch there fails its check, one line each.
    failed_check: list[str] = dataclasses.field(default_factory=list)
    #: The step the bump goes on from (``bump._resume``'s list).
    step: int = 0
    command: str = ""
    #: The stack a ``--new-stack`` bump copies.
    source_stack: str = ""
    #: Coordinated projects with patches, each bumped first: key -> version.
    companion_bumps: dict[str, str] = dataclasses.field(default_factory=dict)
    #: For such a bump: the project whose bump moves this one.
    coordinated_with: str = ""
    #: Each pin the bump moves besides its own: project key -> why.
    moves: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Every patch classified against the new upstream before any was applied.
    preview: list[Classification] = dataclasses.field(default_factory=list)
    #: The journal ``--abort`` restores from: path -> its bytes before (base64), or None.
    before: dict[str, str | None] = dataclasses.field(default_factory=dict)
    #: Folders whose files the journal holds whole: a file not in it is removed on abort.
    journaled_dirs: list[str] = dataclasses.field(default_factory=list)
    #: Each coordinated bump this one ran to its end: key -> its patches' verdicts.
    companion_results: dict[str, list[Classification]] = dataclasses.field(
        default_factory=dict)
    format: int = FORMAT

    def pinned(self, project: Project) -> Project:
        pin = self.new_pin
        return dataclasses.replace(
            project, version=self.new_version, source=pin.source, git=pin.git, sdist=pin.sdist,
            wheels=project.wheels if pin.wheels is None else pin.wheels)

    def cmd(self, option: str) -> str:
        return command("bump", self.stack, self.project, option)

    @staticmethod
    def directory(ws: Workspace, stack: str, project: str) -> Path:
        return ws.state_dir / "bump" / f"{stack}--{project}"

    @staticmethod
    def pending(ws: Workspace, stack: str) -> list[str]:
        """The projects of ``stack`` with a bump in progress, sorted."""
        return sorted(d.name.partition("--")[2] for d in
                      (ws.state_dir / "bump").glob(f"{stack}--*") if d.is_dir())

    def kept_series(self, ws: Workspace) -> Series:
        """The series the bump started from, as it kept it (the patches it applies)."""
        return load_series(self.directory(ws, self.stack, self.project) / "series")

    @classmethod
    def load(cls, ws: Workspace, stack: str, project: str) -> BumpState | None:
        path = cls.directory(ws, stack, project) / "state.json"
        data = read_json_object(path)
        if data is None:
            return None
        if data.get("format") != FORMAT:
            raise MaintenanceError(
                f"a bump in progress was started by an older toolkit (state format "
                f"{data.get('format', 1)}, this one reads {FORMAT})", where=str(path),
                fix=f"finish or undo it with the toolkit that started it; or drop it: remove "
                    f"{path.parent} and put back what it wrote (`git checkout -- forks "
                    "patches reports`)")
        try:
            return typed.read(cls, data, path)
        except ConfigError:
            return None

    def save(self, ws: Workspace) -> None:
        d = self.directory(ws, self.stack, self.project)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / "state.json", json.dumps(dataclasses.asdict(self), indent=1))


def journal(root: Path, files: Iterable[Path], dirs: Iterable[Path]) -> tuple[
        dict[str, str | None], list[str]]:
    """The bytes of ``files`` and of every file under ``dirs``: what :func:`restore` puts
    back."""
    before = {path.relative_to(root).as_posix(): (
        base64.b64encode(path.read_bytes()).decode("ascii") if path.is_file() else None)
        for path in [*files, *(f for d in dirs if d.is_dir() for f in sorted(d.rglob("*"))
                               if f.is_file())]}
    return before, [d.relative_to(root).as_posix() for d in dirs]


def restore(root: Path, before: dict[str, str | None], dirs: Iterable[str], *,
            last: Iterable[str] = ()) -> None:
    """Put every journaled file back byte for byte (``last`` after all others): the
    journaled folders emptied first, so a file the journal does not hold is gone."""
    for d in dirs:
        shutil.rmtree(root / d, ignore_errors=True)
    late = set(last)
    for rel in sorted(before, key=lambda r: r in late):
        data, path = before[rel], root / rel
        if data is None:
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.sm120fork-restore")
        tmp.write_bytes(base64.b64decode(data))
        tmp.replace(path)
