"""What an sdist or a wheel holds: extracted safely (nothing lands outside the
destination), and which of a wheel's files are upstream source."""

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
    """Extract the sdist ``archive`` (a ``.tar.gz``, PEP 625) into ``dest``; its single
    top-level directory.  Absolute and ``..`` paths are refused here (the ``data``
    filter would rewrite them); the rest is the filter's (PEP 706), asked before anything
    is written and again while extracting."""
    dest.mkdir(parents=True, exist_ok=True)
    tops: set[str] = set()
    try:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            for m in members:
                tops.add(check_member(m.name, archive).parts[0])
                tarfile.data_filter(m, str(dest))
            tf.extractall(dest, members=members, filter="data")
    except tarfile.FilterError as exc:
        raise UnsafeArchiveError(str(exc), where=str(archive),
                                 fix="do not use this archive") from exc
    except tarfile.TarError as exc:
        raise SourceError(f"not a readable archive: {exc}", where=str(archive)) from exc
    if len(tops) != 1:
        raise SourceError(f"expected one top-level directory, found {sorted(tops)[:5]}",
                          where=str(archive))
    return dest / tops.pop()


#: Suffixes of compiled files: never part of the tree, never changed by a series.
COMPILED_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".o", ".a", ".cubin", ".fatbin")


def is_compiled(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.endswith(COMPILED_SUFFIXES) or ".so." in name


def is_metadata(member: str) -> bool:
    """A wheel's own metadata (``*.dist-info/``, ``*.data/``): not upstream source."""
    top = member.split("/", 1)[0]
    return top.endswith((".dist-info", ".data"))


def source_members(wheel: Path) -> list[str]:
    """The wheel's files that the upstream repository holds too (relative to the package)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
    for name in names:
        check_member(name, wheel)
    return [n for n in names if not is_metadata(n) and not is_compiled(n)]
