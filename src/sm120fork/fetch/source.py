"""What every source kind shares: a git repository whose first commit (tagged
``upstream``) is unpatched upstream, laid out like the upstream repository."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sm120fork.declare import Project
from sm120fork.util.files import staged_dir
from sm120fork.util.git import Git

UPSTREAM_TAG = "upstream"
#: Called as ``progress(bytes_done, bytes_total_or_None)`` while downloading.
Progress = Callable[[int, int | None], None]


def make_upstream_tree(project: Project, work: Path, fill: Callable[[Path, Path], None],
                       message: str) -> str:
    """Build ``work`` (staged: :func:`staged_dir`) as a git repo whose first commit, tagged
    upstream and returned, is what ``fill(scratch, package_root)`` lays out."""
    with staged_dir(work) as repo_dir:
        dest = repo_dir / project.package_prefix
        dest.mkdir(parents=True)
        fill(repo_dir.parent, dest)
        repo = Git.init(repo_dir)
        head = repo.commit_all(message)
        repo.tag(UPSTREAM_TAG, head)
        return head
