"""The one package-index client: PEP 691 (the JSON simple API).

Lists a project's files, skips yanked ones for anything but an exact pin (PEP 592, with a
note), sorts versions as versions, and checks the index's sha256 against the pin.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from sm120fork.declare import Project
from sm120fork.errors import ChecksumError, SourceError

log = logging.getLogger("sm120fork")
DEFAULT_INDEX = "https://pypi.org/simple"
PEP691_JSON = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    return os.environ.get("SM120FORK_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def open_url(url: str, accept: str | None = None) -> urllib.request._UrlopenRet:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(req, timeout=60)


@dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    url: str
    #: "" when the index lists none.
    sha256: str
    #: PEP 592: False, or the reason (True when the index gives none).
    yanked: bool | str


@dataclass(frozen=True, kw_only=True)
class ProjectPage:
    url: str
    files: tuple[IndexFile, ...]

    def sdists(self, project: Project, *,
               include_yanked: bool = False) -> dict[Version, IndexFile]:
        """The project's sdists that are not yanked, by version, oldest first."""
        found: dict[Version, IndexFile] = {}
        for f in self.files:
            try:
                name, version = parse_sdist_filename(f.filename)
            except InvalidSdistFilename:
                continue
            if canonicalize_name(name) != project.normalized_name:
                continue
            if f.yanked and not include_yanked:
                log.info("skipping %s: yanked on the package index%s", f.filename,
                         f" ({f.yanked})" if isinstance(f.yanked, str) else "")
                continue
            found[version] = f
        return dict(sorted(found.items()))

    def recent(self, project: Project, count: int = 6) -> str:
        versions = list(self.sdists(project))[-count:]
        return ", ".join(str(v) for v in versions) or "none"


def project_page(project: Project) -> ProjectPage:
    """The project's files on the index (``SM120FORK_INDEX_URL``, default PyPI)."""
    page = f"{index_url()}/{project.normalized_name}/"
    try:
        with open_url(page, PEP691_JSON) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"package index answered HTTP {exc.code} for {project.distribution}",
                          where=page, fix="check 'distribution' in the declaration") from exc
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        raise SourceError(f"cannot read the package index: {exc}", where=page,
                          fix="check the network or set SM120FORK_INDEX_URL") from exc
    files = tuple(
        IndexFile(filename=str(e.get("filename", "")),
                  url=urllib.parse.urljoin(page, str(e.get("url", ""))),
                  sha256=str(e.get("hashes", {}).get("sha256", "")),
                  yanked=e.get("yanked") or False)
        for e in data.get("files", []) if isinstance(e, dict))
    return ProjectPage(url=page, files=files)


def find_sdist(project: Project, version: Version) -> IndexFile:
    """The ``version`` sdist for a new pin (``bump``): listed, not yanked, with a sha256."""
    page = project_page(project)
    found = page.sdists(project).get(version)
    if found is None:
        yanked = version in page.sdists(project, include_yanked=True)
        raise SourceError(
            f"{project.distribution} {version} "
            + ("is yanked on the package index" if yanked
               else "has no sdist on the package index (unknown version?)"),
            where=page.url, fix=f"recent sdists: {page.recent(project)}")
    if not found.sha256:
        raise SourceError(f"the index lists no sha256 for {found.filename}", where=page.url)
    return found


def find_wheels(project: Project, version: Version) -> tuple[IndexFile, ...]:
    """Every published wheel of ``version`` (not yanked, with a sha256), for a project
    that ships as published once its series is empty (``bump``)."""
    page = project_page(project)
    found: list[IndexFile] = []
    for f in page.files:
        try:
            name, wheel_version, _, _ = parse_wheel_filename(f.filename)
        except InvalidWheelFilename:
            continue
        if canonicalize_name(name) != project.normalized_name or wheel_version != version:
            continue
        if f.yanked or not f.sha256:
            log.info("skipping %s: %s", f.filename,
                     "yanked on the package index" if f.yanked else "no sha256 listed")
            continue
        found.append(f)
    return tuple(sorted(found, key=lambda f: f.filename))


def resolve_sdist_url(project: Project) -> str:
    """Where the pinned sdist downloads from: its pinned URL, or the index's."""
    pin = project.sdist_pin
    return resolve_file_url(project, pin.filename, pin.sha256, pin.url)


def resolve_file_url(project: Project, filename: str, sha256: str, url: str = "") -> str:
    """Where one pinned file (sdist or wheel) downloads from: its pinned URL, or the index's."""
    if url:
        return url
    page = project_page(project)
    for f in page.files:
        if f.filename != filename:
            continue
        if f.sha256 and f.sha256 != sha256:
            raise ChecksumError(
                f"the index lists sha256 {f.sha256} for {filename}, the pin says {sha256}",
                where=f"project {project.key}",
                fix="re-check the pin; never trust a changed upstream file")
        if f.yanked:  # an exact pin still installs a yanked file (PEP 592)
            log.warning("%s is yanked on the package index%s; using it as pinned",
                        f.filename, f": {f.yanked}" if isinstance(f.yanked, str) else "")
        return f.url
    raise SourceError(
        f"{filename} is not on the package index (unknown version {project.version}?)",
        where=f"project {project.key}", fix=f"recent sdists there: {page.recent(project)}")
