"""What a GPU run that imports trees, not wheels (the SGLang layer path), was made from.

``gpu test`` installs wheels and records their sha256 (:func:`report.made_from`). The layer
harness imports SGLang and FlashInfer from folders: a wheel installed or unpacked there, or
the part of a wheel a leased machine could carry. ``--made-from WHEEL=PATH`` names the
stack's wheel (as ``manifest.json`` lists it) and either that wheel file (its sha256 is the
provenance) or a folder unpacked from it: every file of the folder that the wheel's own
``RECORD`` lists is checked against it, a file that differs is refused, and the RECORD's
sha256 is recorded (upstream_pr compares it with the published wheel's), with how many of
the RECORD's files the folder did not hold. Standard library only: it runs on the GPU box.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120fork.errors import ConfigError


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_tree(tree: Path, wheel: str) -> dict[str, Any]:
    """The folder against its ``*.dist-info/RECORD``: files checked, not carried, RECORD sha256."""
    records = sorted(tree.glob("*.dist-info/RECORD"))
    dist = wheel.split("-", maxsplit=1)[0].lower()
    records = [r for r in records if r.parent.name.split("-", maxsplit=1)[0].lower() == dist]
    if len(records) != 1:
        raise ConfigError(f"expected one {dist}-*.dist-info/RECORD, found {len(records)}",
                          where=str(tree),
                          fix="unpack the wheel there (zip extract keeps its RECORD; pip "
                              "install rewrites it: pass the wheel file instead)")
    record = records[0].read_bytes()
    checked = missing = 0
    for row in csv.reader(io.StringIO(record.decode())):
        if not row or not row[1]:
            continue
        path = tree / row[0]
        if not path.is_file():
            missing += 1
            continue
        algo, want = row[1].split("=", 1)
        got = base64.urlsafe_b64encode(hashlib.new(algo, path.read_bytes()).digest())
        if got.rstrip(b"=").decode() != want.rstrip("="):
            raise ConfigError(f"{row[0]} differs from {wheel}'s RECORD", where=str(tree),
                              fix="unpack the wheel again; the run would not test that wheel")
        checked += 1
    return {"record_sha256": hashlib.sha256(record).hexdigest(), "files_checked": checked,
            "files_not_carried": missing}


def parse_made_from(specs: Sequence[str]) -> list[tuple[str, Path]]:
    out = []
    for spec in specs:
        wheel, sep, path = spec.partition("=")
        if not sep or not wheel.endswith(".whl") or not path:
            raise ConfigError(f"bad --made-from {spec!r}", where="--made-from",
                              fix="write WHEEL=PATH, e.g. sglang-0.5.10.post1+sm120.1-py3-none"
                                  "-any.whl=.device/kit/sglang-0.5.10/<that wheel> or =<its "
                                  "unpacked folder>")
        out.append((wheel, Path(path)))
    return out


def layer_provenance(manifest_path: Path | None, specs: Sequence[str]) -> dict[str, Any]:
    """``stack`` and ``made_from`` (verify.json's shape) of a layer run, or {} without them."""
    made = parse_made_from(specs)
    if manifest_path is None:
        if made:
            raise ConfigError("--made-from needs --manifest", where="--made-from",
                              fix="pass the stack's manifest.json (wheels/<stack>/)")
        return {}
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {manifest_path}: {exc}", where="--manifest") from exc
    wheels = {w.get("wheel"): w for w in manifest.get("wheels", [])}
    rows = []
    for wheel, path in made:
        entry = wheels.get(wheel)
        if entry is None:
            raise ConfigError(f"{wheel} is not a wheel of stack {manifest.get('stack')}",
                              where=str(manifest_path), fix=f"one of {sorted(wheels)}")
        row: dict[str, Any] = {"project": entry.get("project"), "series": entry.get("series"),
                               "series_digest": entry.get("series_digest"), "wheel": wheel,
                               "wheel_sha256": entry.get("sha256")}
        if path.is_file():
            sha = _sha256(path)
            if sha != entry.get("sha256"):
                raise ConfigError(f"{path} is not the {wheel} of the manifest (sha256 "
                                  f"{sha[:12]}, manifest {str(entry.get('sha256'))[:12]})",
                                  where="--made-from")
        elif path.is_dir():
            row.update(tested_sha256=None, **check_tree(path, wheel))
        else:
            raise ConfigError(f"{path} does not exist", where="--made-from")
        rows.append(row)
    return {"stack": manifest.get("stack"), "made_from": rows}
