"""Fetch a pinned upstream source into a git work tree laid out like the upstream repo.

Two source kinds end the same way: a git repository whose first commit (tagged
``upstream``) is unpatched upstream, laid out exactly like the upstream repository, so
patches written against the git layout apply unchanged.

- ``sdist``: download the exact file (PEP 691 index or a pinned URL), check its sha256
  before extracting anything, extract safely, and place it under the package root.
- ``git``: fetch only the pinned commit and refuse when HEAD is not that SHA.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sm120fork.declare import Project
from sm120fork.errors import ChecksumError, CommandError, SourceError, UnsafeArchiveError
from sm120fork.proc import Git

log = logging.getLogger("sm120fork")

DEFAULT_INDEX = "https://pypi.org/simple"
UPSTREAM_TAG = "upstream"
#: Called as ``progress(bytes_done, bytes_total_or_None)`` while downloading.
Progress = Callable[[int, int | None], None]


def index_url() -> str:
    return os.environ.get("SM120FORK_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _open(url: str, accept: str | None = None) -> urllib.request._UrlopenRet:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(req, timeout=60)


def resolve_sdist_url(project: Project) -> str:
    """Find the pinned sdist on the package index (PEP 691 JSON simple API)."""
    if project.sdist.url:
        return project.sdist.url
    page = f"{index_url()}/{project.normalized_name}/"
    try:
        with _open(page, "application/vnd.pypi.simple.v1+json") as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"package index answered HTTP {exc.code} for {project.distribution}",
                          where=page, fix="check 'distribution' in the declaration") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise SourceError(f"cannot reach the package index: {exc}", where=page,
                          fix="check the network or set SM120FORK_INDEX_URL") from exc
    files = data.get("files", [])
    for entry in files:
        if entry.get("filename") == project.sdist.filename:
            listed = entry.get("hashes", {}).get("sha256")
            if listed and listed != project.sdist.sha256:
                raise ChecksumError(
                    f"the index lists sha256 {listed[:12]}... for {project.sdist.filename}, "
                    f"the pin says {project.sdist.sha256[:12]}...",
                    where=f"project {project.key}",
                    fix="re-check the pin; never trust a changed upstream file")
            return urllib.parse.urljoin(page, str(entry["url"]))
    versions = sorted({str(e.get("filename", "")).removesuffix(".tar.gz") for e in files
                       if str(e.get("filename", "")).endswith(".tar.gz")})[-5:]
    raise SourceError(
        f"{project.sdist.filename} is not on the package index "
        f"(unknown version {project.version}?)",
        where=f"project {project.key}",
        fix=f"recent sdists there: {', '.join(versions) or 'none'}")


def download_sdist(project: Project, cache_dir: Path, progress: Progress | None = None) -> Path:
    """Return the cached sdist, downloading it when needed; always sha256-checked."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / project.sdist.filename
    if target.is_file():
        if sha256_file(target) == project.sdist.sha256:
            return target
        # Kept until a download that matches the pin replaces it: the pin may be the
        # thing that is wrong.
        log.warning("cached %s does not match its pin; downloading again", target.name)
    url = resolve_sdist_url(project)
    log.info("downloading %s", url)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=cache_dir)
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, _open(url) as resp:
            total_header = resp.headers.get("Content-Length")
            total = int(total_header) if total_header else None
            done = 0
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                h.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
        if h.hexdigest() != project.sdist.sha256:
            raise ChecksumError(
                f"sha256 mismatch for {project.sdist.filename}: got {h.hexdigest()}, "
                f"pinned {project.sdist.sha256}",
                where=url, fix="the download is corrupt or upstream changed; do not extract it")
        os.replace(tmp, target)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise SourceError(f"download failed: {exc}", where=url) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _check_member(name: str, archive: Path) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")) or ".." in path.parts:
        raise UnsafeArchiveError(f"entry {name!r} would escape the extraction directory",
                                 where=str(archive), fix="do not use this archive")
    return path


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract ``archive`` into ``dest``; return its single top-level directory.

    Refuses absolute paths, ``..`` components, links leaving the tree and special files
    before anything is written.
    """
    dest.mkdir(parents=True, exist_ok=True)
    tops: set[str] = set()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                tops.add(_check_member(info.filename, archive).parts[0])
            zf.extractall(dest)
    else:
        try:
            tf = tarfile.open(archive)
        except tarfile.TarError as exc:
            raise SourceError(f"not a readable archive: {exc}", where=str(archive)) from exc
        with tf:
            members = tf.getmembers()
            for m in members:
                p = _check_member(m.name, archive)
                tops.add(p.parts[0])
                if m.issym() or m.islnk():
                    target = PurePosixPath(m.linkname)
                    base = p.parent if m.issym() else PurePosixPath()
                    resolved = os.path.normpath(str(base / target))
                    if target.is_absolute() or resolved.startswith(".."):
                        raise UnsafeArchiveError(
                            f"link {m.name!r} -> {m.linkname!r} leaves the tree",
                            where=str(archive), fix="do not use this archive")
                elif not (m.isfile() or m.isdir()):
                    raise UnsafeArchiveError(f"special file {m.name!r} in archive",
                                             where=str(archive))
            try:
                tf.extractall(dest, members=members, filter="data")
            except tarfile.TarError as exc:
                raise UnsafeArchiveError(str(exc), where=str(archive)) from exc
    if len(tops) != 1:
        raise SourceError(f"expected one top-level directory, found {sorted(tops)[:5]}",
                          where=str(archive))
    return dest / tops.pop()


@dataclass(frozen=True, kw_only=True)
class SourceInfo:
    kind: str
    #: sha256 of the sdist, or the git commit SHA.
    digest: str
    base_commit: str

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.digest}"


def source_key(project: Project, kind: str | None = None) -> str:
    kind = kind or project.source
    return f"{kind}:{project.sdist.sha256 if kind == 'sdist' else project.git.commit}"


def _commit_upstream(repo: Git, message: str) -> str:
    repo("add", "-A", "--force", ".")
    repo("commit", "-q", "--no-verify", "-m", message)
    repo("tag", "-f", UPSTREAM_TAG)
    return repo.head()


def init_from_sdist(project: Project, sdist: Path, work: Path) -> SourceInfo:
    """Create ``work`` as a git repo whose first commit is the sdist under the package root."""
    staging = Path(tempfile.mkdtemp(prefix=f".{work.name}.", dir=work.parent))
    try:
        top = safe_extract(sdist, staging / "x")
        repo_dir = staging / "repo"
        root = project.package_root.strip("/")
        dest = repo_dir if root in ("", ".") else repo_dir / root
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(top), str(dest))
        repo = Git.init(repo_dir)
        base = _commit_upstream(
            repo, f"Upstream {project.distribution} {project.version}\n\n"
                  f"sdist {project.sdist.filename} sha256 {project.sdist.sha256}\n")
        if work.exists():
            shutil.rmtree(work)
        os.replace(repo_dir, work)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return SourceInfo(kind="sdist", digest=project.sdist.sha256, base_commit=base)


def init_from_git(project: Project, work: Path, url: str | None = None) -> SourceInfo:
    """Fetch only the pinned commit of ``url`` (default: the declared URL) into ``work``."""
    staging = Path(tempfile.mkdtemp(prefix=f".{work.name}.", dir=work.parent))
    try:
        repo_dir = staging / "repo"
        repo = Git.init(repo_dir)
        remote = url or project.git.url
        try:
            repo("fetch", "--quiet", "--depth=1", "--no-tags", remote, project.git.commit)
        except CommandError as exc:
            raise SourceError(
                f"cannot fetch commit {project.git.commit} from {remote}",
                where=f"project {project.key}", detail=exc.detail,
                fix="check git.url and git.commit, or use source = \"sdist\"") from exc
        repo("checkout", "-q", "-B", "main", "FETCH_HEAD")
        head = repo.head()
        if head != project.git.commit:
            raise SourceError(f"HEAD is {head}, not the pinned {project.git.commit}",
                              where=f"project {project.key}",
                              fix="the remote served another commit; never trust a tag")
        repo("tag", "-f", UPSTREAM_TAG)
        if work.exists():
            shutil.rmtree(work)
        os.replace(repo_dir, work)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return SourceInfo(kind="git", digest=project.git.commit, base_commit=project.git.commit)
