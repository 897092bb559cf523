"""Provenance of a GPU run whose wheels travelled whole or as part of their trees.

On the GPU machine, before the run: each carried wheel is checked against the sha256 the
stack's manifest.json records for it; each carried tree (a wheel unpacked, parts left behind)
is checked file by file against its own RECORD, and that RECORD against the sha256 taken of
the wheel's RECORD on the CPU machine. The result names the stack, each project's series
digest and the wheel sha256 the manifest records, so the run's report says what it tested.

  python3 gpu_tree_check.py --manifest M --out provenance.json
      [--wheel FILE ...] [--tree DIR=<wheel stem>.record.sha256 ...]
Exit 1 (and no provenance file) when anything differs. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import sys
from pathlib import Path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record_digest(path: Path, algo: str) -> str:
    raw = hashlib.new(algo, path.read_bytes()).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def check_tree(tree: Path, want_record_sha: str) -> dict[str, object]:
    records = sorted(tree.glob("*.dist-info/RECORD"))
    if len(records) != 1:
        raise SystemExit(f"{tree.name}: expected one *.dist-info/RECORD, found {len(records)}")
    record = records[0]
    got = _sha256(record)
    if got != want_record_sha:
        raise SystemExit(f"{tree.name}: RECORD sha256 {got} is not the kit's {want_record_sha}")
    rows = {r[0]: r[1] for r in csv.reader(io.StringIO(record.read_text())) if r}
    present = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    rec_rel = record.relative_to(tree).as_posix()
    checked = 0
    for rel in present:
        if rel == rec_rel:
            continue
        if rel not in rows or not rows[rel]:
            raise SystemExit(f"{tree.name}: {rel} is not in the wheel's RECORD")
        algo, want = rows[rel].split("=", 1)
        if _record_digest(tree / rel, algo) != want.rstrip("="):
            raise SystemExit(f"{tree.name}: {rel} differs from its RECORD entry")
        checked += 1
    left = len([p for p in rows if p != rec_rel]) - checked
    return {"dist_info": record.parent.name, "record_sha256": got, "files_checked": checked,
            "record_entries_not_carried": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--wheel", type=Path, action="append", default=[])
    parser.add_argument("--tree", action="append", default=[], metavar="DIR=RECORD_SHA256_FILE")
    args = parser.parse_args()
    manifest = json.loads(args.manifest.read_text())
    by_name = {Path(w["wheel"]).name: w for w in manifest["wheels"]}
    tested = []
    for wheel in args.wheel:
        entry = by_name.get(wheel.name)
        if entry is None:
            raise SystemExit(f"{wheel.name}: not in {args.manifest.name}")
        got = _sha256(wheel)
        if got != entry["sha256"]:
            raise SystemExit(f"{wheel.name}: sha256 {got} is not the manifest's {entry['sha256']}")
        tested.append({"wheel": wheel.name, "sha256": got, "carried": "whole"})
    for spec in args.tree:
        tree_s, _, sha_file = spec.partition("=")
        # <wheel stem>.record.sha256, written by the kit from the wheel the manifest names
        wheel_name = Path(sha_file).name.removesuffix(".record.sha256") + ".whl"
        entry = by_name.get(wheel_name)
        if entry is None:
            raise SystemExit(f"{wheel_name}: not in {args.manifest.name}")
        result = check_tree(Path(tree_s), Path(sha_file).read_text().split()[0])
        tested.append({"wheel": wheel_name, "sha256": entry["sha256"], "carried": "tree",
                       **result})
    projects = {w["project"]: {"series_digest": w.get("series_digest"),
                               "patches": len(w.get("patches") or []),
                               "used_as_published": w.get("used_as_published", False)}
                for w in manifest["wheels"]}
    wheels = {Path(w["wheel"]).name: w["sha256"] for w in manifest["wheels"]}
    doc = {"stack": manifest["stack"], "toolkit_version": manifest.get("toolkit_version"),
           "projects": projects, "manifest_wheels": wheels, "tested": tested}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for t in tested:
        print("checked", json.dumps(t))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
