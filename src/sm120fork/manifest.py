"""``wheels/<stack>/manifest.json``, typed: what a build published, wheel by wheel.

Every stage reads it through :func:`read` or :func:`load`, never as a dict.  Standard
library and the toolkit's errors only: the GPU box reads it without the build's dependencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120fork.errors import ConfigError
from sm120fork.util import typed

FILE = "manifest.json"


@dataclass(frozen=True, kw_only=True)
class FingerprintResult:
    """One ``Fingerprint`` of one patch, looked for in the shipped wheel and upstream."""

    patch: str
    path: str
    text: str
    member: str
    in_wheel: bool
    in_upstream: bool
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", self.in_wheel and not self.in_upstream)


@dataclass(frozen=True, kw_only=True)
class SourceRecord:
    """Where the upstream input came from: its kind, digest, and file or URL."""

    kind: str
    digest: str
    filename: str | None = None
    url: str | None = None


@dataclass(frozen=True, kw_only=True)
class PatchRecord:
    name: str
    sha256: str
    subject: str
    applied_upstream: str = ""


#: How a build's ``check`` starts when it was told to publish whatever its check said
#: (``build --unchecked``) and the check failed or could not run; then why.
UNCHECKED = "unchecked (built with --unchecked)"


@dataclass(frozen=True, kw_only=True)
class ManifestEntry:
    """One wheel of a build; its fields in the order ``manifest.json`` lists them."""

    project: str
    distribution: str
    upstream_version: str
    #: The version the wheel carries (with the local label unless used as published).
    version: str
    upstream_commit: str | None
    upstream_commit_verified: bool
    source: SourceRecord
    series: str
    series_digest: str
    patches: tuple[PatchRecord, ...]
    used_as_published: bool = False
    #: The patched fork tree (absent for a wheel used as published).
    patched_commit: str | None = field(default=None, metadata=typed.OMIT_EMPTY)
    tree: str | None = field(default=None, metadata=typed.OMIT_EMPTY)
    #: Files of a repacked wheel that the series changed (wheel sources only).
    changed_files: tuple[str, ...] | None = field(default=None, metadata=typed.OMIT_EMPTY)
    wheel: str
    sha256: str
    artifact_check: tuple[FingerprintResult, ...] = ()
    #: What checked the patched tree before the build published it
    #: (:mod:`sm120fork.patch.check`'s summary), or :data:`UNCHECKED`; "" for none made.
    check: str = field(default="", metadata=typed.OMIT_EMPTY)
    toolkit_version: str

    def patch(self, name: str) -> PatchRecord | None:
        """The record of the series' patch ``name`` this wheel was built with, if any."""
        return next((p for p in self.patches if p.name == name), None)


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """One published build: the toolkit that built it, the stack, and its wheels."""

    toolkit_version: str
    stack: str
    wheels: tuple[ManifestEntry, ...]

    def of(self, project: str) -> tuple[ManifestEntry, ...]:
        """The entries of ``project`` (one per Python and platform for some projects)."""
        return tuple(w for w in self.wheels if w.project == project)

    def first(self, project: str) -> ManifestEntry | None:
        return next(iter(self.of(project)), None)

    def to_json(self) -> Any:
        return typed.dump(self, nulls=True)

    @classmethod
    def from_json(cls, data: object, where: str | Path = "") -> Manifest:
        """:class:`~sm120fork.util.typed.MalformedError` naming the dotted key when ``data`` is
        not a manifest."""
        return typed.read(cls, data, where, strict=False)


def read(path: Path, *, fix: str | None = None) -> Manifest:
    """The manifest at ``path`` (a file, or the folder holding it); ConfigError naming the
    file when it is missing or not a manifest."""
    if path.is_dir() or path.name != FILE:
        path = path / FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"no readable {FILE} ({exc.strerror or exc})", where=str(path),
                          fix=fix) from exc
    except ValueError as exc:
        raise ConfigError(f"not a build manifest: not JSON: {exc}", where=str(path),
                          fix=fix) from exc
    try:
        return Manifest.from_json(data, path)
    except typed.MalformedError as exc:
        raise ConfigError(f"not a build manifest: {exc.what}", where=exc.where,
                          fix=fix) from exc


def load(path: Path) -> Manifest | None:
    """The manifest at ``path`` (a file or its folder), or None when there is none or it is
    unreadable: for the readers that show what was built, if anything."""
    try:
        return read(path)
    except ConfigError:
        return None
