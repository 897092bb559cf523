"""The ``git`` source kind: only the pinned commit, refusing any other HEAD."""

from __future__ import annotations

from pathlib import Path

from sm120fork.declare import Project
from sm120fork.errors import CommandError, SourceError
from sm120fork.fetch.source import UPSTREAM_TAG
from sm120fork.util.files import staged_dir
from sm120fork.util.git import Git


def init_from_git(project: Project, work: Path) -> str:
    """Fetch only the pinned commit into ``work``; that commit."""
    with staged_dir(work) as repo_dir:
        repo = Git.init(repo_dir)
        remote = project.git_pin.url
        try:
            repo("fetch", "--quiet", "--depth=1", "--no-tags", remote, project.git_pin.commit)
        except CommandError as exc:
            raise SourceError(
                f"cannot fetch commit {project.git_pin.commit} from {remote}",
                where=f"project {project.key}", detail=exc.detail,
                fix="check git.url and git.commit, or use source = \"sdist\"") from exc
        repo("checkout", "-q", "-B", "main", "FETCH_HEAD")
        head = repo.head()
        if head != project.git_pin.commit:
            raise SourceError(f"HEAD is {head}, not the pinned {project.git_pin.commit}",
                              where=f"project {project.key}",
                              fix="the remote served another commit; never trust a tag")
        repo.tag(UPSTREAM_TAG)
    return project.git_pin.commit
