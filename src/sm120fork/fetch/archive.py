"""Safe extraction of an sdist: nothing lands outside the destination."""

from __future__ import annotations

import os
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from sm120fork.errors import SourceError, UnsafeArchiveError


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
