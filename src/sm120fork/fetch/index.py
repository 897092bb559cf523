"""The one package-index client, configured as ``pip config list`` says pip is (pip has
no Python API); unearth reads the pages and files.  ``SM120FORK_INDEX_URL`` replaces the
index URLs and find-links alone."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import os
import posixpath
import ssl
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, cast

import httpx2
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version
from unearth import Link, PackageFinder
from unearth.auth import MultiDomainBasicAuth
from unearth.fetchers import Fetcher, PyPIClient

from sm120fork.declare import FilePin, Project, WheelPin
from sm120fork.errors import ChecksumError, SourceError
from sm120fork.util import proc
from sm120fork.util.files import atomic_make, sha256_file

log = logging.getLogger("sm120fork")
_PIP_FIX = "check pip's configuration (`python -m pip config list`) and the network"
_SECTIONS = ("global", "download", ":env:")  # pip download's, each over the one before
_ALIASES = {"default-timeout": "timeout"}  # two names of one pip option
#: Called as ``progress(bytes_done, bytes_total_or_None)`` while downloading.
Progress = Callable[[int, int | None], None]


def pip_config() -> dict[str, str]:
    """pip's configuration as ``pip download`` takes it, read again when the environment
    that finds it changed."""
    return dict(_read_pip_config(tuple(sorted(
        (k, v) for k, v in os.environ.items()
        if k.startswith(("PIP_", "XDG_")) or k in ("HOME", "VIRTUAL_ENV")))))


@functools.cache
def _read_pip_config(_environment: tuple[tuple[str, str], ...]) -> dict[str, str]:
    done = proc.run([sys.executable, "-m", "pip", "config", "list"], check=False, quiet=True)
    if done.returncode != 0:
        raise SourceError(f"pip's configuration cannot be read: {done.stderr.strip()}",
                          fix=_PIP_FIX)
    ranked = []
    for line in done.stdout.splitlines():  # section.name='value'
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in _SECTIONS:
            ranked.append((_SECTIONS.index(section), _ALIASES.get(name, name),
                           str(ast.literal_eval(value))))
    return {name: value for _, name, value in sorted(ranked)}


def _sources(config: dict[str, str]) -> tuple[list[str], list[str]]:
    if override := os.environ.get("SM120FORK_INDEX_URL", "").strip():  # tests, one-off runs
        return [override], []
    links = config.get("find-links", "").split()
    for missing in [f for f in links if "://" not in f and not os.path.exists(f)]:
        log.warning("find-links %s in pip's configuration is ignored: no such path", missing)
        links.remove(missing)
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        return [], links
    return [config.get("index-url") or "https://pypi.org/simple",
            *config.get("extra-index-url", "").split()], links


def _transports(config: dict[str, str]) -> dict[str, httpx2.BaseTransport]:
    """Mounted (a client's own transport would turn the proxy variables off); a trusted
    host unverified."""
    try:
        context = ssl.create_default_context(cafile=config.get("cert") or None)
        if config.get("client-cert"):
            context.load_cert_chain(config["client-cert"])
    except (OSError, ssl.SSLError) as exc:
        raise SourceError(f"pip's certificates cannot be loaded (cert {config.get('cert')!r}, "
                          f"client-cert {config.get('client-cert')!r}): {exc}",
                          fix=_PIP_FIX) from exc
    proxy, retries = config.get("proxy") or None, int(config.get("retries") or 5)
    mounts: dict[str, httpx2.BaseTransport] = {"all://": httpx2.HTTPTransport(
        verify=context, proxy=proxy, retries=retries)}
    for host, scheme in itertools.product(config.get("trusted-host", "").split(),
                                          ("http", "https")):
        via = proxy or (None if urllib.request.proxy_bypass(host)
                        else urllib.request.getproxies().get(scheme))
        mounts[f"{scheme}://{host}"] = httpx2.HTTPTransport(verify=False, proxy=via,
                                                            retries=retries)
    return mounts


@contextlib.contextmanager
def _client(config: dict[str, str], index_urls: list[str]) -> Iterator[PyPIClient]:
    with PyPIClient(trusted_hosts=config.get("trusted-host", "").split(),
                    mounts=_transports(config), trust_env=not config.get("proxy"),
                    timeout=float(config.get("timeout") or 15)) as client:
        client.auth = MultiDomainBasicAuth(prompting=False, index_urls=index_urls)
        yield client


def download(url: str, out: IO[bytes], progress: Progress | None = None) -> str:
    """Write the file at ``url`` to ``out``; its sha256, for the caller to check."""
    digest = hashlib.sha256()
    config = {} if url.startswith("file:") else pip_config()
    with _client(config, _sources(config)[0]) as client:
        try:
            with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp:
                resp.raise_for_status()
                total = int(resp.headers.get("Content-Length", 0)) or None
                for chunk in resp.iter_bytes(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    if progress:
                        progress(resp.num_bytes_downloaded, total)
        except httpx2.HTTPError as exc:
            raise SourceError(f"download failed: {exc}", where=Link(url).redacted,
                              fix=_PIP_FIX) from exc
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    url: str
    sha256: str
    #: PEP 592: False, or the reason (True when the index gives none).
    yanked: bool | str


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProjectPage:
    url: str
    files: tuple[IndexFile, ...]

    def sdists(self, project: Project, *,
               include_yanked: bool = False) -> dict[Version, IndexFile]:
        found: dict[Version, IndexFile] = {}
        for version, f in self.files_of(project, wheels=False):
            if f.yanked and not include_yanked:
                log.info("skipping %s: yanked on the package index%s", f.filename,
                         f" ({f.yanked})" if isinstance(f.yanked, str) else "")
                continue
            found[version] = f
        return dict(sorted(found.items()))

    def files_of(self, project: Project, *,
                 wheels: bool) -> Iterator[tuple[Version, IndexFile]]:
        for f in self.files:
            with contextlib.suppress(InvalidSdistFilename, InvalidWheelFilename):
                name, version = (parse_wheel_filename(f.filename)[:2] if wheels
                                 else parse_sdist_filename(f.filename))
                if canonicalize_name(name) == project.normalized_name:
                    yield version, f

    def releases(self, project: Project) -> list[Version]:
        """Every version with an sdist or wheel not yanked, oldest first."""
        return sorted(set(self.sdists(project))
                      | {version for version, f in self.files_of(project, wheels=True)
                         if not f.yanked})

    def recent(self, project: Project) -> str:
        versions = list(self.sdists(project))[-6:]
        return ", ".join(str(v) for v in versions) or "none"


def project_page(project: Project) -> ProjectPage:
    name, config = project.normalized_name, pip_config()
    index_urls, find_links = _sources(config)
    where = " ".join(Link(posixpath.join(url, name) + "/").redacted for url in index_urls)
    fix = f"check 'distribution' in the declaration; {_PIP_FIX}"
    with _client(config, index_urls) as client:
        finder = PackageFinder(session=cast("Fetcher", client), index_urls=index_urls,
                               find_links=find_links, ignore_compatibility=True,
                               trusted_hosts=config.get("trusted-host", "").split())
        if not finder.sources:
            raise SourceError("pip's configuration names no package index (--no-index?)",
                              fix=_PIP_FIX)
        try:
            links = [p.link for p in finder.find_all_packages(name, allow_yanked=True)]
        except httpx2.HTTPError as exc:
            raise SourceError(f"cannot read {project.distribution}'s page on the package "
                              f"index: {exc}", where=where, fix=fix) from exc
    if not links:  # unearth warned of each page it could not read
        raise SourceError(f"the package index lists no file of {project.distribution}",
                          where=where, fix=fix)
    return ProjectPage(url=where, files=tuple(
        IndexFile(filename=link.filename, url=link.url_without_fragment,
                  sha256=(link.hash_option or {}).get("sha256", [""])[0],
                  yanked=(link.yank_reason or True) if link.is_yanked else False)
        for link in links))


def find_sdist(project: Project, version: Version) -> IndexFile:
    """The ``version`` sdist for a new pin: listed, not yanked, with a sha256."""
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


def find_wheels(project: Project, version: Version) -> tuple[WheelPin, ...]:
    """Every published wheel of ``version`` (not yanked, with a sha256) as pins."""
    found: list[WheelPin] = []
    for f in (f for v, f in project_page(project).files_of(project, wheels=True) if v == version):
        if f.yanked or not f.sha256:
            log.info("skipping %s: %s", f.filename,
                     "yanked on the package index" if f.yanked else "no sha256 listed")
        else:
            found.append(WheelPin(filename=f.filename, sha256=f.sha256))
    return tuple(sorted(found, key=lambda f: f.filename))


def resolve_file_url(project: Project, pin: FilePin) -> str:
    if pin.url:
        return pin.url
    page = project_page(project)
    for f in (f for f in page.files if f.filename == pin.filename):
        if f.sha256 and f.sha256 != pin.sha256:
            raise ChecksumError(
                f"the index lists sha256 {f.sha256} for {f.filename}, the pin says {pin.sha256}",
                where=f"project {project.key}",
                fix="re-check the pin; never trust a changed upstream file")
        if f.yanked:  # an exact pin still installs a yanked file (PEP 592)
            log.warning("%s is yanked on the package index%s; using it as pinned",
                        f.filename, f": {f.yanked}" if isinstance(f.yanked, str) else "")
        return f.url
    raise SourceError(
        f"{pin.filename} is not on the package index (unknown version {project.version}?)",
        where=f"project {project.key}", fix=f"recent sdists there: {page.recent(project)}")


def download_pinned(project: Project, pin: FilePin, cache_dir: Path,
                    progress: Progress | None = None) -> Path:
    """Return the cached file of ``pin``, downloading it when needed; always sha256-checked."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / pin.filename
    if target.is_file():
        if sha256_file(target) == pin.sha256:
            return target
        # Kept until a matching download replaces it: the pin may be what is wrong.
        log.warning("cached %s does not match its pin; downloading again", target.name)
    url = resolve_file_url(project, pin)
    log.info("downloading %s", url)

    def fill(tmp: Path) -> None:
        try:
            with tmp.open("wb") as out:
                got = download(url, out, progress)
        except OSError as exc:
            raise SourceError(f"download failed: {exc}", where=url) from exc
        if got != pin.sha256:
            raise ChecksumError(
                f"sha256 mismatch for {pin.filename}: got {got}, pinned {pin.sha256}",
                where=url, fix="the download is corrupt or upstream changed; do not extract it")

    atomic_make(target, fill)
    return target
