"""A kit written in parts (``--part-size``), for transfer paths that take so many bytes.

Sibling folders ``DIR.1`` ... ``DIR.N``: whole files where they fit (first fit, largest
first), a larger file cut into pieces.  Each part carries ``run``, ``boot.py`` and a
``kit.json`` listing every piece's part, path and sha256, so any part joins them
(:func:`boot.join`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path

from sm120fork.errors import ConfigError
from sm120fork.kit import boot
from sm120fork.util.files import replace_dir, scratch_prefix, sha256_file

OWN_FILES = ("run", "boot.py")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Piece:
    file: str  # path inside the kit
    offset: int
    size: int
    index: int  # 1-based
    count: int

    @property
    def path(self) -> str:
        suffix = "" if self.count == 1 else f".piece-{self.index}-of-{self.count}"
        return f"data/{self.file}{suffix}"


def files_of(folder: Path) -> dict[str, int]:
    """{path inside ``folder``: bytes} of its files."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _pieces(files: dict[str, int], budget: int) -> list[Piece]:
    out = []
    for name, size in files.items():
        count = max(1, -(-size // budget))
        out += [Piece(file=name, offset=i * budget, size=min(budget, size - i * budget),
                      index=i + 1, count=count) for i in range(count)]
    return out


def layout(files: dict[str, int], budget: int) -> list[list[Piece]]:
    """The kit's files (path -> bytes) in parts of at most ``budget`` bytes (ties by name:
    the same kit gives the same parts)."""
    bins: list[list[Piece]] = []
    room: list[int] = []
    for piece in sorted(_pieces(files, budget), key=lambda p: (-p.size, p.file, p.index)):
        for i, free in enumerate(room):
            if piece.size <= free:
                bins[i].append(piece)
                room[i] -= piece.size
                break
        else:
            bins.append([piece])
            room.append(budget - piece.size)
    return bins


def _copy_range(source: Path, dest: Path, offset: int, size: int) -> str:
    digest = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as f, dest.open("wb") as out:
        f.seek(offset)
        left = size
        while left:
            block = f.read(min(left, 1 << 20))
            if not block:
                raise ConfigError(f"{source} shrank while the kit was cut into parts",
                                  where=str(source))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


def _index(kit: Path, bins: list[list[Piece]], shas: dict[tuple[str, int], str],
           part: int) -> boot.PartsIndex:
    where = {(p.file, p.index): n for n, pieces in enumerate(bins, 1) for p in pieces}
    files = []
    for name in sorted({p.file for pieces in bins for p in pieces}):
        pieces = sorted((p for b in bins for p in b if p.file == name), key=lambda p: p.index)
        files.append(boot.PartFile(
            file=name, size=sum(p.size for p in pieces), sha256=shas[(name, 0)],
            pieces=tuple(boot.PartPiece(part=where[(name, p.index)], path=p.path,
                                        size=p.size, sha256=shas.get((name, p.index), ""))
                         for p in pieces),
            executable=os.access(kit / name, os.X_OK)))
    listed = json.dumps([dataclasses.asdict(f) for f in files], sort_keys=True)
    kit_id = hashlib.sha256(listed.encode()).hexdigest()
    return boot.PartsIndex(kit_id=kit_id, part=part, parts=len(bins), files=tuple(files))


def plan(kit: Path, part_size: int) -> tuple[list[list[Piece]], int]:
    """The parts of ``kit`` and the bytes each part spends on ``run``, ``boot.py`` and
    ``kit.json``."""
    files = files_of(kit)
    own = sum((kit / name).stat().st_size for name in OWN_FILES)
    overhead = own + 4096
    for _ in range(8):
        budget = part_size - overhead
        if budget < 1024:
            raise ConfigError(
                f"a part of {part_size} bytes leaves no room for the kit's files (each part "
                f"carries its own run, boot.py and kit.json, {overhead} bytes)",
                where="--part-size", fix="e.g. --part-size 60MiB")
        bins = layout(files, budget)
        # The index's own size, with every sha256 as long as it will be.
        fake = {(p.file, i): "0" * 64 for b in bins for p in b for i in (0, p.index)}
        needed = own + len(_index(kit, bins, fake, len(bins)).dumps().encode())
        if needed <= overhead:
            return bins, overhead
        overhead = needed + 1024
    raise ConfigError("could not fit the kit's index into its parts", where="--part-size")


def write_parts(kit: Path, out: Path, part_size: int) -> list[tuple[Path, int]]:
    """``kit`` as ``out.1`` ... ``out.N`` (each replaced as a whole, stale higher parts
    removed): (part folder, bytes) of each."""
    bins, _ = plan(kit, part_size)
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(out.name + "-parts"),
                                    dir=out.parent))
    try:
        shas: dict[tuple[str, int], str] = {}
        for n, pieces in enumerate(bins, 1):
            for piece in pieces:
                dest = scratch / str(n) / piece.path
                shas[(piece.file, piece.index)] = _copy_range(
                    kit / piece.file, dest, piece.offset, piece.size)
                if piece.count == 1:
                    shas[(piece.file, 0)] = shas[(piece.file, piece.index)]
                elif (piece.file, 0) not in shas:
                    shas[(piece.file, 0)] = sha256_file(kit / piece.file)
        written = []
        for n in range(1, len(bins) + 1):
            folder = scratch / str(n)
            for name in OWN_FILES:
                shutil.copy2(kit / name, folder / name)
            index = _index(kit, bins, shas, n).dumps()
            (folder / boot.KIT_FILE).write_text(index, encoding="utf-8")
            size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            if size > part_size:  # plan() reserved room for this: a bug if not
                raise ConfigError(f"part {n} would be {size} bytes, over {part_size}",
                                  where="--part-size")
            written.append((folder, size))
        final = []
        for n, (folder, size) in enumerate(written, 1):
            dest = out.parent / f"{out.name}.{n}"
            replace_dir(folder, dest)
            final.append((dest, size))
        _remove_stale_parts(out, len(bins))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def _remove_stale_parts(out: Path, count: int) -> None:
    for n in itertools.count(count + 1):
        stale = out.parent / f"{out.name}.{n}"
        try:
            boot.read_parts(stale)
        except boot.KitError:
            return
        shutil.rmtree(stale)
