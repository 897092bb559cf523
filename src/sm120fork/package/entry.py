"""One wheel's record in ``manifest.json`` and in the build cache, typed.

Every source kind (:mod:`sm120fork.package.kinds`) makes these, the release step writes
them, and every later stage (the CLI's table, ``verify-sm120``, the AOT build, status)
reads the same fields, not dicts by string keys.  ``from_json`` reads what ``to_json``
wrote, and the entries an earlier toolkit cached (the same keys, some absent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sm120fork.package.artifact import FingerprintResult
from sm120fork.patch.series import Patch


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
    applied_upstream: str

    @classmethod
    def of(cls, patch: Patch) -> PatchRecord:
        return cls(name=patch.name, sha256=patch.sha256, subject=patch.subject,
                   applied_upstream=patch.applied_upstream)


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

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
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
        }
        if self.patched_commit is not None:
            data["patched_commit"] = self.patched_commit
            data["tree"] = self.tree
        if self.changed_files is not None:
            data["changed_files"] = list(self.changed_files)
        data.update({
            "wheel": self.wheel,
            "sha256": self.sha256,
            "artifact_check": [r.to_json() for r in self.artifact_check],
            "toolkit_version": self.toolkit_version,
        })
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ManifestEntry:
        """The entry ``data`` records; KeyError/TypeError/ValueError when it is not one."""
        source = data["source"]
        changed = data.get("changed_files")
        return cls(
            project=str(data["project"]), distribution=str(data["distribution"]),
            upstream_version=str(data["upstream_version"]), version=str(data["version"]),
            upstream_commit=data.get("upstream_commit"),
            upstream_commit_verified=bool(data.get("upstream_commit_verified", False)),
            source=SourceRecord(kind=str(source["kind"]), digest=str(source["digest"]),
                                filename=source.get("filename"), url=source.get("url")),
            series=str(data["series"]), series_digest=str(data["series_digest"]),
            patches=tuple(PatchRecord(name=p["name"], sha256=p["sha256"],
                                      subject=p["subject"],
                                      applied_upstream=p.get("applied_upstream") or "")
                          for p in data["patches"]),
            wheel=str(data["wheel"]), sha256=str(data["sha256"]),
            toolkit_version=str(data["toolkit_version"]),
            used_as_published=bool(data.get("used_as_published", False)),
            patched_commit=data.get("patched_commit"), tree=data.get("tree"),
            changed_files=tuple(changed) if changed is not None else None,
            artifact_check=tuple(
                FingerprintResult(**{k: v for k, v in r.items() if k != "passed"})
                for r in data.get("artifact_check", ())),
        )
