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
    if project.sdist.url:
        return project.sdist.url
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


