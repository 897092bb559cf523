"""File digests, atomic writes, folder swaps and JSON reading: one definition each."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def dist_info(wheel: Path, name: str) -> bytes | None:
    """The wheel's top-level ``*.dist-info/<name>`` (``METADATA``, ``RECORD``); None unless
    it is a readable zip holding exactly one."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            found = [n for n in zf.namelist() if n.count("/") == 1
                     and n.endswith(f".dist-info/{name}")]
            return zf.read(found[0]) if len(found) == 1 else None
    except (OSError, zipfile.BadZipFile):
        return None


def wheel_record_sha256(wheel: Path) -> str | None:
    """sha256 of a wheel's ``*.dist-info/RECORD``, which holds every file's own sha256: two
    zips with the same RECORD and checked files are the same wheel in other bytes."""
    record = dist_info(wheel, "RECORD")
    return None if record is None else hashlib.sha256(record).hexdigest()


def atomic_make(dest: Path, fill: Callable[[Path], object]) -> None:
    """Make ``dest`` (mode 0644) beside it, then rename: a reader never sees half a file,
    and what a killed run leaves is scratch (:func:`remove_stale_scratch`)."""
    fd, tmp = tempfile.mkstemp(prefix=scratch_prefix(dest.name), dir=dest.parent)
    os.close(fd)
    try:
        fill(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_make(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_copy(src: Path, dest: Path) -> None:
    atomic_make(dest, lambda tmp: shutil.copyfile(src, tmp))


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(staged: Path, dest: Path) -> None:
    """Put folder ``staged`` at ``dest`` (same file system): a reader sees the old folder
    or the new one, never a mix (exchanged in one step, else the old one renamed aside)."""
    if not dest.exists():
        os.rename(staged, dest)
        return
    if _exchange(staged, dest):
        shutil.rmtree(staged)
        return
    aside = staged.with_name(f".{dest.name}.old-{os.getpid()}")
    os.rename(dest, aside)
    try:
        os.rename(staged, dest)
    except BaseException:
        os.rename(aside, dest)
        raise
    shutil.rmtree(aside)


_SCRATCH = "sm120fork-"


def scratch_prefix(label: str, *, hidden: bool = True) -> str:
    """A temporary name's prefix naming this process, for :func:`remove_stale_scratch`."""
    return f"{'.' if hidden else ''}{_SCRATCH}{os.getpid()}-{label}-"


@contextlib.contextmanager
def staged_dir(dest: Path, *, label: str = "") -> Iterator[Path]:
    """Yields a path (not made yet) beside ``dest`` for the block to make; on success it
    replaces ``dest`` whole (:func:`replace_dir`), on error ``dest`` stays as it was."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(label or dest.name),
                                    dir=dest.parent))
    try:
        new = scratch / "new"
        yield new
        replace_dir(new, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


STAMP = ".sm120fork-stamp"  # in a folder made_once made: the digest it was made for


def made_once(dest: Path, digest: str, make: Callable[[Path], object]) -> Path:
    """``dest`` as ``make(path)`` makes it, made again only when its stamp holds a digest
    other than ``digest`` (a hash of its inputs)."""
    with contextlib.suppress(OSError):
        if (dest / STAMP).read_text(encoding="utf-8").strip() == digest:
            return dest
    with staged_dir(dest) as new:
        make(new)
        (new / STAMP).write_text(digest + "\n", encoding="utf-8")
    return dest


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale_scratch(parent: Path) -> list[Path]:
    """Remove the scratch in ``parent`` of processes that are gone; what was removed."""
    removed: list[Path] = []
    for path in parent.iterdir() if parent.is_dir() else ():
        name = path.name.removeprefix(".")
        pid = name[len(_SCRATCH):].split("-", 1)[0]
        if name.startswith(_SCRATCH) and pid.isdigit() and not _alive(int(pid)):
            _remove(path)
            removed.append(path)
    return removed


def remove_own_scratch(parents: list[Path]) -> list[Path]:
    """Remove this process's scratch in ``parents`` (after an interrupt); what remains."""
    mine = f"{_SCRATCH}{os.getpid()}-"
    left: list[Path] = []
    for path in (p for parent in parents if parent.is_dir() for p in parent.iterdir()):
        if path.name.removeprefix(".").startswith(mine):
            _remove(path)
            if path.exists() or path.is_symlink():
                left.append(path)
    return left


def read_json_object(path: Path) -> dict[str, object] | None:
    """None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
