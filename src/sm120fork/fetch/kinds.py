"""The source kinds, as the one registry (one class per kind, one interface): no other
module branches on a kind's name (CONTRIBUTING.md, "Source kinds")."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

from sm120fork.declare import Project
from sm120fork.fetch.git import init_from_git
from sm120fork.fetch.sdist import download_pinned, init_from_sdist
from sm120fork.fetch.source import Progress
from sm120fork.fetch.wheel import init_from_wheel


class SourceFetch(Protocol):
    name: str
    #: Its input is the release's published wheels.
    ships_wheels: bool

    def digest(self, project: Project) -> str:
        """What identifies the pinned source: what fork trees and build caches key on."""

    def origin(self, project: Project) -> tuple[str | None, str | None]:
        """The manifest's ``source.filename`` and ``source.url`` of the project's pin."""

    def download(self, project: Project, *, sdist_cache: Path, wheel_cache: Path,
                 progress: Progress | None = None) -> list[Path]:
        """A build's inputs of this kind, cached and sha256-checked."""

    def missing(self, project: Project, *, sdist_cache: Path, wheel_cache: Path) -> list[str]:
        """What making the unpatched fork tree would download (none when cached)."""

    def init_tree(self, project: Project, work: Path, *, sdist_cache: Path,
                  wheel_cache: Path, progress: Progress | None = None) -> str:
        """Create ``work`` as the pinned upstream; its commit (tagged upstream)."""


class Sdist:
    name = "sdist"
    ships_wheels = False

    def digest(self, project: Project) -> str:
        return project.sdist_pin.sha256

    def origin(self, project: Project) -> tuple[str | None, str | None]:
        return project.sdist_pin.filename, None

    def download(self, project: Project, *, sdist_cache: Path, wheel_cache: Path,
                 progress: Progress | None = None) -> list[Path]:
        return [download_pinned(project, project.sdist_pin, sdist_cache, progress)]

    def missing(self, project: Project, *, sdist_cache: Path, wheel_cache: Path) -> list[str]:
        name = project.sdist_pin.filename
        return [] if (sdist_cache / name).is_file() else [name]

    def init_tree(self, project: Project, work: Path, *, sdist_cache: Path,
                  wheel_cache: Path, progress: Progress | None = None) -> str:
        sdist = download_pinned(project, project.sdist_pin, sdist_cache, progress)
        return init_from_sdist(project, sdist, work)


class GitCommit:
    name = "git"
    ships_wheels = False

    def digest(self, project: Project) -> str:
        return project.git_pin.commit

    def origin(self, project: Project) -> tuple[str | None, str | None]:
        return None, project.git_pin.url

    def download(self, project: Project, *, sdist_cache: Path, wheel_cache: Path,
                 progress: Progress | None = None) -> list[Path]:
        return []  # fetched into the fork tree itself

    def missing(self, project: Project, *, sdist_cache: Path, wheel_cache: Path) -> list[str]:
        return [f"{project.git_pin.url} at {project.git_pin.commit[:12]}"]

    def init_tree(self, project: Project, work: Path, *, sdist_cache: Path,
                  wheel_cache: Path, progress: Progress | None = None) -> str:
        return init_from_git(project, work)


class PublishedWheels:
    name = "wheel"
    ships_wheels = True

    def digest(self, project: Project) -> str:
        """The sha256 over the declared wheels' sha256s."""
        joined = "\n".join(f"{w.filename} {w.sha256}" for w in project.wheels)
        return hashlib.sha256(joined.encode()).hexdigest()

    def origin(self, project: Project) -> tuple[str | None, str | None]:
        return None, None  # one per wheel: its pin's

    def download(self, project: Project, *, sdist_cache: Path, wheel_cache: Path,
                 progress: Progress | None = None) -> list[Path]:
        return [download_pinned(project, pin, wheel_cache, progress) for pin in project.wheels]

    def missing(self, project: Project, *, sdist_cache: Path, wheel_cache: Path) -> list[str]:
        # The fork tree is laid out from the first wheel (the others differ in compiled
        # files only, which the tree leaves out).
        return [w.filename for w in project.wheels[:1] if not (wheel_cache / w.filename).is_file()]

    def init_tree(self, project: Project, work: Path, *, sdist_cache: Path,
                  wheel_cache: Path, progress: Progress | None = None) -> str:
        wheel = download_pinned(project, project.wheels[0], wheel_cache, progress)
        return init_from_wheel(project, wheel, work)


#: The published wheels, whatever kind a project declares: what an empty series ships.
PUBLISHED = PublishedWheels()
KINDS: dict[str, SourceFetch] = {k.name: k for k in (Sdist(), GitCommit(), PUBLISHED)}


def source_kind(name: str) -> SourceFetch:
    """The registered kind ``name`` (``declare.py`` refuses any other in a declaration)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown source kind {name!r}") from None


def source_key(project: Project, kind: str | None = None) -> str:
    """``<kind>:<digest>``: what a fork tree and a build cache record of their source."""
    kind = kind or project.source
    return f"{kind}:{source_kind(kind).digest(project)}"


def fetch_source(project: Project, kind: str, work: Path, *, sdist_cache: Path,
                 wheel_cache: Path, progress: Progress | None = None) -> str:
    """Create ``work`` as the pinned upstream of ``kind``; its commit (tagged upstream)."""
    return source_kind(kind).init_tree(project, work, sdist_cache=sdist_cache,
                                       wheel_cache=wheel_cache, progress=progress)
