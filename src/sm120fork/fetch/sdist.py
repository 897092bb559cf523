"""The ``sdist`` source kind: the exact file from the package index (or a pinned URL),
sha256-checked before it is extracted under the package root."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from sm120fork.declare import Project, SdistPin, WheelPin
from sm120fork.errors import ChecksumError, SourceError
from sm120fork.fetch.archive import safe_extract
from sm120fork.fetch.index import download, resolve_file_url
from sm120fork.fetch.source import Progress, make_upstream_tree
from sm120fork.util.files import scratch_prefix, sha256_file

log = logging.getLogger("sm120fork")


def download_pinned(project: Project, pin: SdistPin | WheelPin, cache_dir: Path,
                    progress: Progress | None = None) -> Path:
    """Return the cached file of ``pin``, downloading it when needed; always sha256-checked."""
    filename, sha256 = pin.filename, pin.sha256
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / filename
    if target.is_file():
        if sha256_file(target) == sha256:
            return target
        # Kept until a matching download replaces it: the pin may be what is wrong.
        log.warning("cached %s does not match its pin; downloading again", target.name)
    url = resolve_file_url(project, filename, sha256, pin.url)
    log.info("downloading %s", url)
    fd, tmp_name = tempfile.mkstemp(prefix=scratch_prefix(target.name), suffix=".part",
                                    dir=cache_dir)
    tmp = Path(tmp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                got = download(url, out, progress)
        except OSError as exc:
            raise SourceError(f"download failed: {exc}", where=url) from exc
        if got != sha256:
            raise ChecksumError(
                f"sha256 mismatch for {filename}: got {got}, pinned {sha256}",
                where=url, fix="the download is corrupt or upstream changed; do not extract it")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def init_from_sdist(project: Project, sdist: Path, work: Path) -> str:
    """Create ``work`` as a git repo whose first commit is the sdist under the package root."""
    def fill(scratch: Path, dest: Path) -> None:
        top = safe_extract(sdist, scratch / "x")
        dest.rmdir()
        shutil.move(str(top), str(dest))

    return make_upstream_tree(
        project, work, fill,
        f"Upstream {project.distribution} {project.version}\n\n"
        f"sdist {project.sdist_pin.filename} sha256 {project.sdist_pin.sha256}\n")
