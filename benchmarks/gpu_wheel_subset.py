"""Carry the part of a large FlashInfer wheel that the comm module's JIT and the GPU harness
read, and check it file by file against the wheel's RECORD where it is used.

A leased GPU call carries at most 64 MiB; FlashInfer 0.7.4's wheels are 97 MiB (published)
and 122 MiB (the fork's build). What a `gpu test` run reads of them is the Python package,
the headers the trtllm comm module includes (data/include, data/spdlog, data/cccl) and its
three sources; the other kernels' sources (data/csrc, data/cutlass, and the .cu/.h files of
the other modules) stay behind, listed.

  pack WHEEL OUT [--base BASE_WHEEL]  (CPU machine) OUT/<wheel>.files: the carried paths;
      OUT/<wheel>.tar.xz: those files, or with --base only the ones whose bytes differ from
      BASE_WHEEL's at the same path (the rest travel once, in BASE's archive);
      OUT/<wheel>.record.sha256: the sha256 of the wheel's RECORD.
  unpack OUT WHEEL_NAME DEST [--base BASE_TREE]  (GPU machine) the tree of WHEEL_NAME under
      DEST/tree (from BASE_TREE plus its own archive), every carried file checked against
      the RECORD, the RECORD against its sha256; then DEST/<WHEEL_NAME>, the tree zipped
      again (stored), with the full RECORD: the same files, fewer of them, other bytes.
      Prints what was checked and how many RECORD entries were not carried.
Standard library only (the GPU machine's Python 3.12).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

#: Sources of the other kernels: the comm JIT and the harness's imports never read them.
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".c", ".inl", ".ptx", ".inc",
                   ".jinja")
#: What the trtllm comm module's JIT reads under flashinfer/data/ (nvcc -M of its three
#: sources with FlashInfer's include paths: data/include, data/spdlog, data/cccl; csrc/).
DATA_TREES = ("flashinfer/data/include/", "flashinfer/data/spdlog/", "flashinfer/data/cccl/")
COMM_SOURCES = tuple(f"flashinfer/data/csrc/{name}" for name in (
    "trtllm_allreduce.cu", "trtllm_allreduce_fusion.cu", "trtllm_moe_allreduce_fusion.cu",
    "tvm_ffi_utils.h"))


def carried(path: str) -> bool:
    if path.startswith("flashinfer/data/"):
        return path.startswith(DATA_TREES) or path in COMM_SOURCES
    return not path.endswith(SOURCE_SUFFIXES)


def record_name(names: list[str]) -> str:
    (name,) = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    return name


def parse_record(text: str) -> dict[str, str]:
    """path -> 'sha256=...' (the RECORD's own row has no digest)."""
    return {row[0]: row[1] for row in csv.reader(io.StringIO(text)) if row}


def pack(wheel: Path, out: Path, base: Path | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        rec = record_name(names)
        record = zf.read(rec)
        rows = parse_record(record.decode())
        paths = sorted(p for p in rows if carried(p) or p.startswith(rec.split("/")[0] + "/"))
        base_rows: dict[str, str] = {}
        if base is not None:
            with zipfile.ZipFile(base) as bz:
                base_rows = parse_record(bz.read(record_name(bz.namelist())).decode())
        own = [p for p in paths if not base_rows.get(p) or base_rows[p] != rows[p]
               or p == rec]
        stem = out / wheel.name
        Path(f"{stem}.files").write_text("\n".join(paths) + "\n")
        Path(f"{stem}.record.sha256").write_text(hashlib.sha256(record).hexdigest() + "\n")
        with tarfile.open(f"{stem}.tar.xz", "w:xz", preset=6) as tar:
            for p in own:
                data = zf.read(p)
                info = tarfile.TarInfo(p)
                info.size, info.mtime, info.mode = len(data), 315532800, 0o644  # 1980: zip-able
                tar.addfile(info, io.BytesIO(data))
    print(f"{wheel.name}: {len(paths)} of {len(rows)} files carried, {len(own)} in its own "
          f"archive" + (f" (the rest are {base.name}'s bytes)" if base else ""))


def _digest(path: Path, algo: str) -> str:
    return base64.urlsafe_b64encode(hashlib.new(algo, path.read_bytes()).digest()
                                    ).rstrip(b"=").decode()


def unpack(kit: Path, wheel_name: str, dest: Path, base: Path | None) -> None:
    stem = kit / wheel_name
    paths = Path(f"{stem}.files").read_text().split()
    want_record = Path(f"{stem}.record.sha256").read_text().strip()
    tree = dest / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    with tarfile.open(f"{stem}.tar.xz") as tar:
        tar.extractall(tree, filter="data")
    own = {p for p in paths if (tree / p).is_file()}
    for p in paths:
        if p not in own:
            if base is None or not (base / p).is_file():
                sys.exit(f"{wheel_name}: {p} is in neither archive")
            (tree / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base / p, tree / p)
    rec = record_name(paths)
    record = (tree / rec).read_bytes()
    if hashlib.sha256(record).hexdigest() != want_record:
        sys.exit(f"{wheel_name}: RECORD sha256 differs from the kit's")
    rows = parse_record(record.decode())
    checked = 0
    for p in paths:
        if p == rec:
            continue
        algo, want = rows[p].split("=", 1)
        if _digest(tree / p, algo) != want.rstrip("="):
            sys.exit(f"{wheel_name}: {p} differs from its RECORD entry")
        checked += 1
    listed = set(paths)
    extra = sorted(str(f.relative_to(tree)) for f in tree.rglob("*") if f.is_file()
                   and str(f.relative_to(tree)) not in listed)
    if extra:
        sys.exit(f"{wheel_name}: files not in the carried list: {extra[:5]}")
    out = dest / wheel_name
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, strict_timestamps=False) as zf:
        for p in paths:
            zf.write(tree / p, p)
    left = len([p for p in rows if p != rec]) - checked
    print(f"{wheel_name}: {checked} files checked against its RECORD (sha256 {want_record}), "
          f"{len(own)} from its own archive, {checked + 1 - len(own)} from the base tree; "
          f"{left} RECORD entries not carried (other kernels' sources); zipped to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack")
    p.add_argument("wheel", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--base", type=Path)
    u = sub.add_parser("unpack")
    u.add_argument("kit", type=Path)
    u.add_argument("wheel_name")
    u.add_argument("dest", type=Path)
    u.add_argument("--base", type=Path)
    args = parser.parse_args()
    if args.verb == "pack":
        pack(args.wheel, args.out, args.base)
    else:
        unpack(args.kit, args.wheel_name, args.dest, args.base)


if __name__ == "__main__":
    main()
