"""``wheels/<stack>/manifest.json``, typed: what a build published, wheel by wheel.

Every stage reads it through :func:`read` or :func:`load`, never as a dict.  Standard
library and the toolkit's errors only: the GPU box reads it without the build's dependencies.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

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

    @property
    def passed(self) -> bool:
        return self.in_wheel and not self.in_upstream

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "passed": self.passed}


@dataclass(frozen=True, kw_only=True)
class SourceRecord:
    """Where the upstream input came from: its kind, digest, and file or URL."""

    kind: str
    digest: str
    filename: str | None = None
    url: str | None = None


class _PatchLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def applied_upstream(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class PatchRecord:
    name: str
    sha256: str
    subject: str
    applied_upstream: str = ""

    @classmethod
    def of(cls, patch: _PatchLike) -> PatchRecord:
        return cls(name=patch.name, sha256=patch.sha256, subject=patch.subject,
                   applied_upstream=patch.applied_upstream)


#: How a build's ``check`` starts when it was told to publish whatever its check said
#: (``build --unchecked``) and the check failed or could not run; then why.
UNCHECKED = "unchecked (built with --unchecked)"


@dataclass(frozen=True, kw_only=True)
class ManifestEntry:
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
    wheel: str
    sha256: str
    toolkit_version: str
    used_as_published: bool = False
    #: The patched fork tree (absent for a wheel used as published).
    patched_commit: str | None = None
    tree: str | None = None
    #: Files of a repacked wheel that the series changed (wheel sources only).
    changed_files: tuple[str, ...] | None = None
    artifact_check: tuple[FingerprintResult, ...] = ()
    #: What checked the patched tree before the build published it
    #: (:mod:`sm120fork.patch.check`'s summary), or :data:`UNCHECKED`; "" for none made.
    check: str = ""

    def patch(self, name: str) -> PatchRecord | None:
        """The record of the series' patch ``name`` this wheel was built with, if any."""
        return next((p for p in self.patches if p.name == name), None)

    def to_json(self) -> dict[str, object]:
        tree = {} if self.patched_commit is None else {
            "patched_commit": self.patched_commit, "tree": self.tree}
        changed = {} if self.changed_files is None else {"changed_files": list(self.changed_files)}
        return {
            "project": self.project,
            "distribution": self.distribution,
            "upstream_version": self.upstream_version,
            "version": self.version,
            "upstream_commit": self.upstream_commit,
            "upstream_commit_verified": self.upstream_commit_verified,
            "source": {"kind": self.source.kind, "digest": self.source.digest,
                       "filename": self.source.filename, "url": self.source.url},
            "series": self.series,
            "series_digest": self.series_digest,
            "patches": [{"name": p.name, "sha256": p.sha256, "subject": p.subject,
                         "applied_upstream": p.applied_upstream} for p in self.patches],
            "used_as_published": self.used_as_published,
            **tree,
            **changed,
            "wheel": self.wheel,
            "sha256": self.sha256,
            "artifact_check": [r.to_json() for r in self.artifact_check],
            **({"check": self.check} if self.check else {}),
            "toolkit_version": self.toolkit_version,
        }


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """One published build: the stack, the toolkit that built it, and its wheels."""

    stack: str
    toolkit_version: str
    wheels: tuple[ManifestEntry, ...]

    def of(self, project: str) -> tuple[ManifestEntry, ...]:
        """The entries of ``project`` (one per Python and platform for some projects)."""
        return tuple(w for w in self.wheels if w.project == project)

    def first(self, project: str) -> ManifestEntry | None:
        return next(iter(self.of(project)), None)

    def to_json(self) -> dict[str, object]:
        return {"toolkit_version": self.toolkit_version, "stack": self.stack,
                "wheels": [w.to_json() for w in self.wheels]}

    @classmethod
    def from_json(cls, data: object, where: str | Path = "") -> Manifest:
        """:class:`~sm120fork.util.typed.MalformedError` naming the dotted key when ``data`` is
        not a manifest."""
        return typed.read(cls, data, where, strict=False)


def read(path: Path, *, fix: str | None = None) -> Manifest:
    """The manifest at ``path`` (a file, or the folder holding it); ConfigError naming the
    file when it is missing or not a manifest."""
    import json

    if path.is_dir() or path.name != FILE:
        path = path / FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"no readable {FILE} ({exc.strerror or exc})", where=str(path),
                          fix=fix) from exc
    try:
        data = json.loads(text)
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
