"""What every source kind shares: each ends as a git repository whose first commit (tagged
``upstream``) is unpatched upstream, laid out exactly like the upstream repository, so
patches written against the git layout apply unchanged (the kinds: :mod:`.kinds`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sm120fork.declare import Project
from sm120fork.util.files import staged_dir
from sm120fork.util.git import Git

UPSTREAM_TAG = "upstream"
#: Called as ``progress(bytes_done, bytes_total_or_None)`` while downloading.
Progress = Callable[[int, int | None], None]


@dataclass(frozen=True, kw_only=True)
class SourceInfo:
    kind: str
    #: sha256 of the sdist, the git commit SHA, or the digest of the wheel pins.
    digest: str
    base_commit: str

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.digest}"


def make_upstream_tree(project: Project, work: Path, fill: Callable[[Path, Path], None],
                       message: str) -> str:
    """Build ``work`` as a git repo whose first commit (tagged upstream) is what ``fill``
    lays out; return that commit.

    ``fill(scratch, dest)`` gets a scratch folder and ``dest``, the package root inside
    the repository to be (it exists).  Everything happens in a staging folder beside
    ``work`` named for this process (a killed run's leftovers are removed by the next
    run); ``work`` is replaced only once the commit exists (:func:`staged_dir`).
    """
    with staged_dir(work) as repo_dir:
        root = project.package_root.strip("/")
        dest = repo_dir if root in ("", ".") else repo_dir / root
        dest.mkdir(parents=True)
        fill(repo_dir.parent, dest)
        repo = Git.init(repo_dir)
        head = repo.commit_all(message)
        repo.tag(UPSTREAM_TAG, head)
        return head
