"""The one dispatch on a project's source kind."""

from __future__ import annotations

from pathlib import Path

from sm120fork.declare import Project
from sm120fork.fetch.git import init_from_git
from sm120fork.fetch.sdist import download_sdist, init_from_sdist
from sm120fork.fetch.source import Progress, SourceInfo
from sm120fork.fetch.wheel import download_wheel, init_from_wheel


def fetch_source(project: Project, kind: str, work: Path, *, sdist_cache: Path,
                 wheel_cache: Path | None = None, progress: Progress | None = None,
                 git_url: str | None = None) -> SourceInfo:
    """Create ``work`` as the pinned upstream of ``kind`` (first commit tagged upstream)."""
    if kind == "wheel":
        cache = wheel_cache or sdist_cache.parent / "wheels"
        return init_from_wheel(project, download_wheel(project, project.wheels[0], cache,
                                                       progress), work)
    if kind == "sdist":
        return init_from_sdist(project, download_sdist(project, sdist_cache, progress), work)
    if kind == "git":
        return init_from_git(project, work, git_url)
    raise ValueError(f"unknown source kind {kind!r}")  # declare.py validates kinds
