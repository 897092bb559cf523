"""The source kinds, as the one registry (one class per kind, one interface): no other
module branches on a kind's name (CONTRIBUTING.md, "Source kinds"); and how each makes
the unpatched fork tree: an sdist (sha256-checked, extracted under the package root), only
the pinned git commit (refusing any other HEAD), or the first declared wheel's sources (no
``.dist-info``, no compiled files, as upstream's repository). Each is a git repository whose
first commit (tagged ``upstream``) is unpatched upstream, laid out like the upstream
repository."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sm120fork.declare import Project
from sm120fork.errors import CommandError, SourceError
from sm120fork.fetch.archive import safe_extract, source_members
from sm120fork.fetch.index import Progress, download_pinned
from sm120fork.util.files import staged_dir
from sm120fork.util.git import Git

UPSTREAM_TAG = "upstream"


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


def init_from_wheel(project: Project, wheel: Path, work: Path) -> str:
    """Create ``work`` as a git repo whose first commit is the wheel's sources."""
    members = source_members(wheel)
    if not members:
        raise SourceError("the wheel holds no source files", where=str(wheel))

    def fill(_scratch: Path, dest: Path) -> None:
        with zipfile.ZipFile(wheel) as zf:
            for name in members:  # each checked by source_members
                target = Path(zf.extract(name, dest))
                if (zf.getinfo(name).external_attr >> 16) & 0o111:
                    target.chmod(0o755)

    pin = project.wheels[0]
    return make_upstream_tree(
        project, work, fill,
        f"Upstream {project.distribution} {project.version}\n\n"
        f"wheel {pin.filename} sha256 {pin.sha256} (compiled files left out)\n")


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

        def fill(scratch: Path, dest: Path) -> None:  # the sdist under the package root
            top = safe_extract(sdist, scratch / "x")
            dest.rmdir()
            shutil.move(str(top), str(dest))

        return make_upstream_tree(
            project, work, fill,
            f"Upstream {project.distribution} {project.version}\n\n"
            f"sdist {project.sdist_pin.filename} sha256 {project.sdist_pin.sha256}\n")


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
