"""The one package-index client: pip's own, configured as the user configured pip.

The index URLs (``index-url``, ``extra-index-url``), proxies, certificates, client
certificates, trusted hosts, timeouts and retries, netrc and keyring credentials come
from pip's configuration as pip reads it (``pip.conf`` files, ``PIP_CONFIG_FILE``,
``PIP_*`` variables), and pages are fetched and parsed by pip's own code (PEP 691 JSON
or PEP 503 HTML, whichever the index serves).  ``SM120FORK_INDEX_URL``, when set,
replaces the index URLs alone (one index; the rest of pip's configuration still holds).

Lists a project's files, skips yanked ones for anything but an exact pin (PEP 592, with a
note), sorts versions as versions, and checks the index's sha256 against the pin; the
download itself is checked against the pin before anything uses it (:mod:`.sdist`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import IO, Any

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
#: The toolkit's own override of pip's index URLs (tests, a one-off run).
INDEX_URL_VARIABLE = "SM120FORK_INDEX_URL"
_PIP_FIX = "check pip's configuration (`python -m pip config list`) and the network"


@dataclasses.dataclass(frozen=True)
class PipIndex:
    """pip's session (proxies, certificates, credentials) and its link collector (the
    index URLs), as pip's configuration sets them up."""

    session: Any
    collector: Any

    @property
    def index_urls(self) -> list[str]:
        urls: list[str] = self.collector.search_scope.index_urls
        return urls


@contextlib.contextmanager
def pip_index() -> Iterator[PipIndex]:
    """pip's view of the package index, read the way ``pip download`` reads it."""
    try:
        from pip._internal.cli.index_command import SessionCommandMixin
        from pip._internal.commands import create_command
        from pip._internal.index.collector import LinkCollector
    except ImportError as exc:  # pragma: no cover - pip ships with every venv
        raise SourceError("pip is not importable in the toolkit's environment",
                          fix="install pip there (`python -m ensurepip`)") from exc
    command = create_command("download")
    assert isinstance(command, SessionCommandMixin)  # pip download talks to the index
    override = os.environ.get(INDEX_URL_VARIABLE, "").strip()
    # The toolkit caches what it downloads itself (by sha256); pip's HTTP cache would
    # only keep a second copy.
    args = ["--no-cache-dir", *(["--index-url", override] if override else [])]
    try:
        options, _ = command.parse_args(args)
    except SystemExit as exc:  # pip's option parser exits on a bad configuration value
        raise SourceError("pip's configuration cannot be read", fix=_PIP_FIX) from exc
    if override:
        options.extra_index_urls = []
        options.find_links = []
    session = command._build_session(options)
    with session:
        yield PipIndex(session=session, collector=LinkCollector.create(session, options))


def download(url: str, out: IO[bytes],
             progress: Callable[[int, int | None], None] | None = None) -> str:
    """Write the file at ``url`` to ``out`` through pip's session; its sha256 (the
    caller compares it with the pin before using the file)."""
    from pip._vendor.requests import RequestException

    digest = hashlib.sha256()
    with pip_index() as index:
        try:
            with index.session.get(url, stream=True,
                                   headers={"Accept-Encoding": "identity"}) as resp:
                resp.raise_for_status()
                total_header = resp.headers.get("Content-Length")
                total = int(total_header) if total_header else None
                done = 0
                for chunk in resp.iter_content(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
        except RequestException as exc:
            raise SourceError(f"download failed: {exc}", where=_redact(url),
                              fix=_PIP_FIX) from exc
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    url: str
    #: "" when the index lists none.
    sha256: str
    #: PEP 592: False, or the reason (True when the index gives none).
    yanked: bool | str


@dataclasses.dataclass(frozen=True, kw_only=True)
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

    def releases(self, project: Project) -> list[Version]:
        """Every version of the project with a file not yanked (an sdist or a wheel: a
        release published as wheels alone counts), oldest first."""
        found = set(self.sdists(project))
        for f in self.files:
            try:
                name, version, _, _ = parse_wheel_filename(f.filename)
            except InvalidWheelFilename:
                continue
            if canonicalize_name(name) == project.normalized_name and not f.yanked:
                found.add(version)
        return sorted(found)

    def recent(self, project: Project, count: int = 6) -> str:
        versions = list(self.sdists(project))[-count:]
        return ", ".join(str(v) for v in versions) or "none"


def project_page(project: Project) -> ProjectPage:
    """The project's files on every index pip's configuration names."""
    from pip._internal.index.collector import parse_links
    from pip._internal.models.link import Link

    with pip_index() as index:
        pages = index.collector.search_scope.get_index_urls_locations(project.normalized_name)
        if not pages:
            raise SourceError("pip's configuration names no package index (--no-index?)",
                              fix=_PIP_FIX)
        files: list[IndexFile] = []
        read = 0
        for page in pages:
            content = index.collector.fetch_response(Link(page), project.normalized_name)
            if content is None:  # pip said why (a warning); another index may have it
                continue
            read += 1
            # pip keeps parsed pages for the life of its process; a page read again
            # (a bump that retries) must be read as the index serves it now.
            content = dataclasses.replace(content, cache_link_parsing=False)
            files += [IndexFile(filename=link.filename, url=link.url_without_fragment,
                                sha256=link._hashes.get("sha256", ""),
                                yanked=(link.yanked_reason or True) if link.is_yanked
                                else False)
                      for link in parse_links(content)]
    where = " ".join(_redact(p) for p in pages)
    if not read:
        raise SourceError(f"cannot read {project.distribution}'s page on the package index",
                          where=where, fix=f"check 'distribution' in the declaration; "
                                           f"{_PIP_FIX}")
    return ProjectPage(url=where, files=tuple(files))


def _redact(url: str) -> str:
    from pip._internal.utils.misc import redact_auth_from_url

    redacted: str = redact_auth_from_url(url)
    return redacted


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
