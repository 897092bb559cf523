"""The package-index client: find a pinned file on a PEP 691 (JSON simple API) index."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

from sm120fork.declare import Project
from sm120fork.errors import ChecksumError, SourceError

DEFAULT_INDEX = "https://pypi.org/simple"


def index_url() -> str:
    return os.environ.get("SM120FORK_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def open_url(url: str, accept: str | None = None) -> urllib.request._UrlopenRet:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(req, timeout=60)


def resolve_sdist_url(project: Project) -> str:
    """Find the pinned sdist on the package index (PEP 691 JSON simple API)."""
    pin = project.sdist_pin
    return resolve_file_url(project, pin.filename, pin.sha256, pin.url)


def resolve_file_url(project: Project, filename: str, sha256: str, url: str = "") -> str:
    """Find one pinned file (sdist or wheel) of ``project`` on the package index."""
    if url:
        return url
    page = f"{index_url()}/{project.normalized_name}/"
    try:
        with open_url(page, "application/vnd.pypi.simple.v1+json") as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"package index answered HTTP {exc.code} for {project.distribution}",
                          where=page, fix="check 'distribution' in the declaration") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise SourceError(f"cannot reach the package index: {exc}", where=page,
                          fix="check the network or set SM120FORK_INDEX_URL") from exc
    files = data.get("files", [])
    for entry in files:
        if entry.get("filename") == filename:
            listed = entry.get("hashes", {}).get("sha256")
            if listed and listed != sha256:
                raise ChecksumError(
                    f"the index lists sha256 {listed[:12]}... for {filename}, "
                    f"the pin says {sha256[:12]}...",
                    where=f"project {project.key}",
                    fix="re-check the pin; never trust a changed upstream file")
            return urllib.parse.urljoin(page, str(entry["url"]))
    suffix = ".whl" if filename.endswith(".whl") else ".tar.gz"
    recent = sorted({str(e.get("filename", "")) for e in files
                     if str(e.get("filename", "")).endswith(suffix)})[-5:]
    raise SourceError(
        f"{filename} is not on the package index (unknown version {project.version}?)",
        where=f"project {project.key}",
        fix=f"recent files there: {', '.join(recent) or 'none'}")
