"""Safe extraction of an sdist: nothing lands outside the destination."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from sm120fork.errors import SourceError, UnsafeArchiveError


def check_member(name: str, archive: Path) -> PurePosixPath:
    """``name`` of a member of ``archive``, refused if it would land outside the destination."""
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")) or ".." in path.parts:
        raise UnsafeArchiveError(f"entry {name!r} would escape the extraction directory",
                                 where=str(archive), fix="do not use this archive")
    return path


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract ``archive`` into ``dest``; its single top-level directory.  Absolute and
    ``..`` paths are refused here (the ``data`` filter would rewrite them); the rest is the
    filter's (PEP 706), asked before anything is written and again while extracting."""
    dest.mkdir(parents=True, exist_ok=True)
    tops: set[str] = set()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                tops.add(check_member(info.filename, archive).parts[0])
            zf.extractall(dest)
    else:
        try:
            tf = tarfile.open(archive)
        except tarfile.TarError as exc:
            raise SourceError(f"not a readable archive: {exc}", where=str(archive)) from exc
        with tf:
            try:
                members = tf.getmembers()
                for m in members:
                    tops.add(check_member(m.name, archive).parts[0])
                    tarfile.data_filter(m, str(dest))
                tf.extractall(dest, members=members, filter="data")
            except tarfile.FilterError as exc:
                raise UnsafeArchiveError(str(exc), where=str(archive),
                                         fix="do not use this archive") from exc
            except tarfile.TarError as exc:
                raise SourceError(f"not a readable archive: {exc}",
                                  where=str(archive)) from exc
    if len(tops) != 1:
        raise SourceError(f"expected one top-level directory, found {sorted(tops)[:5]}",
                          where=str(archive))
    return dest / tops.pop()
