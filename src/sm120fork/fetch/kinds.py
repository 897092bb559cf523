"""The source kinds, as the one registry (one class per kind, one interface): no other
module branches on a kind's name (CONTRIBUTING.md, "Source kinds").  Each makes the fork
tree as a git repository whose first commit (tagged ``upstream``) is the pinned upstream,
laid out like the upstream repository (a wheel's: no ``.dist-info``, no compiled files)."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

from sm120fork.declare import FilePin, Project
from sm120fork.errors import CommandError, SourceError
from sm120fork.fetch.archive import safe_extract, source_members
from sm120fork.fetch.index import Progress, download_pinned
from sm120fork.util.files import staged_dir
from sm120fork.util.git import Git
from sm120fork.workspace import Workspace

UPSTREAM_TAG = "upstream"


class SourceFetch:
    """A kind: the files it pins, downloaded into its cache, and how it makes the unpatched
    fork tree (by default laid out from the first pinned file)."""

    name: str
    #: Its input is the release's published wheels.
    ships_wheels = False

    def pins(self, project: Project) -> tuple[FilePin, ...]:
        return ()

    def cache(self, ws: Workspace) -> Path:
        return ws.sdist_cache

    def digest(self, project: Project) -> str:
        """What identifies the pinned source: what fork trees and build caches key on."""
        raise NotImplementedError

    def origin(self, project: Project) -> tuple[str | None, str | None]:
        """The manifest's ``source.filename`` and ``source.url`` of the project's pin."""
        return None, None

    def download(self, project: Project, ws: Workspace,
                 progress: Progress | None = None) -> list[Path]:
        """A build's inputs of this kind, cached and sha256-checked."""
        return [download_pinned(project, pin, self.cache(ws), progress)
                for pin in self.pins(project)]

    def missing(self, project: Project, ws: Workspace) -> list[str]:
        """What making the unpatched fork tree would download (none when cached)."""
        return [pin.filename for pin in self.pins(project)[:1]
                if not (self.cache(ws) / pin.filename).is_file()]

    def init_tree(self, project: Project, work: Path, ws: Workspace,
                  progress: Progress | None = None) -> str:
        """Create ``work`` (staged: :func:`staged_dir`) as a git repo whose first commit,
        tagged upstream and returned, is the first pinned file laid out under the package
        root."""
        pin = self.pins(project)[0]
        path = download_pinned(project, pin, self.cache(ws), progress)
        with staged_dir(work) as repo_dir:
            self.lay_out(path, repo_dir.parent, repo_dir / project.package_prefix)
            repo = Git.init(repo_dir)
            head = repo.commit_all(f"Upstream {project.distribution} {project.version}\n\n"
                                   f"{self.name} {pin.filename} sha256 {pin.sha256}"
                                   f"{self.left_out}\n")
            repo.tag(UPSTREAM_TAG, head)
            return head

    #: What the tree leaves out of the file, as its first commit says.
    left_out = ""

    def lay_out(self, path: Path, scratch: Path, dest: Path) -> None:
        raise NotImplementedError


class Sdist(SourceFetch):
    name = "sdist"

    def pins(self, project: Project) -> tuple[FilePin, ...]:
        return (project.sdist_pin,)

    def digest(self, project: Project) -> str:
        return project.sdist_pin.sha256

    def origin(self, project: Project) -> tuple[str | None, str | None]:
        return project.sdist_pin.filename, None

    def lay_out(self, path: Path, scratch: Path, dest: Path) -> None:
        top = safe_extract(path, scratch / "x")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(top), str(dest))


class GitCommit(SourceFetch):
    name = "git"

    def digest(self, project: Project) -> str:
        return project.git_pin.commit

    def origin(self, project: Project) -> tuple[str | None, str | None]:
        return None, project.git_pin.url

    def missing(self, project: Project, ws: Workspace) -> list[str]:
        return [f"{project.git_pin.url} at {project.git_pin.commit[:12]}"]

    def init_tree(self, project: Project, work: Path, ws: Workspace,
                  progress: Progress | None = None) -> str:
        """Fetch only the pinned commit into ``work``."""
        pin = project.git_pin
        with staged_dir(work) as repo_dir:
            repo = Git.init(repo_dir)
            try:
                repo("fetch", "--quiet", "--depth=1", "--no-tags", pin.url, pin.commit)
            except CommandError as exc:
                raise SourceError(
                    f"cannot fetch commit {pin.commit} from {pin.url}",
                    where=f"project {project.key}", detail=exc.detail,
                    fix="check git.url and git.commit, or use source = \"sdist\"") from exc
            repo("checkout", "-q", "-B", "main", "FETCH_HEAD")
            head = repo.head()
            if head != pin.commit:
                raise SourceError(f"HEAD is {head}, not the pinned {pin.commit}",
                                  where=f"project {project.key}",
                                  fix="the remote served another commit; never trust a tag")
            repo.tag(UPSTREAM_TAG)
        return pin.commit


class PublishedWheels(SourceFetch):
    """The fork tree is laid out from the first wheel's sources (the others differ in
    compiled files only, which the tree leaves out, as it does ``.dist-info``)."""

    name = "wheel"
    ships_wheels = True
    left_out = " (compiled files left out)"

    def pins(self, project: Project) -> tuple[FilePin, ...]:
        return project.wheels

    def cache(self, ws: Workspace) -> Path:
        return ws.wheel_cache

    def digest(self, project: Project) -> str:
        """The sha256 over the declared wheels' sha256s."""
        joined = "\n".join(f"{w.filename} {w.sha256}" for w in project.wheels)
        return hashlib.sha256(joined.encode()).hexdigest()

    def lay_out(self, path: Path, scratch: Path, dest: Path) -> None:
        members = source_members(path)  # each checked
        if not members:
            raise SourceError("the wheel holds no source files", where=str(path))
        with zipfile.ZipFile(path) as zf:
            for name in members:
                target = Path(zf.extract(name, dest))
                if (zf.getinfo(name).external_attr >> 16) & 0o111:
                    target.chmod(0o755)


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


def fetch_source(project: Project, kind: str, work: Path, ws: Workspace,
                 progress: Progress | None = None) -> str:
    """Create ``work`` as the pinned upstream of ``kind``; its commit (tagged upstream)."""
    return source_kind(kind).init_tree(project, work, ws, progress)
