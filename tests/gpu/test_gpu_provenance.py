"""A layer run records the stack's wheels it imported: the wheel file, or its unpacked tree
checked against the wheel's own RECORD (upstream_pr compares that with the published one)."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from sm120fork.errors import ConfigError
from sm120fork.gpu import provenance, runs

WHEEL = "sglang-0.5.23+sm120.1-cp312-cp312-manylinux_2_34_x86_64.whl"


def _wheel(tmp_path: Path) -> Path:
    files = {"sglang/__init__.py": b"x = 1\n", "sglang/srt/layer.py": b"y = 2\n"}
    rows = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    rows.append("sglang-0.5.23+sm120.1.dist-info/RECORD,,")
    path = tmp_path / WHEEL
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("sglang-0.5.23+sm120.1.dist-info/RECORD", "\n".join(rows) + "\n")
    return path


def _manifest(tmp_path: Path, wheel: Path) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"stack": "sglang-0.5.23", "wheels": [{
        "project": "sglang", "series": "patches/sglang-0.5.23/sglang", "series_digest": "d" * 64,
        "wheel": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}]}))
    return path


def test_a_wheel_file_is_recorded_by_its_sha256(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    made = provenance.layer_provenance(_manifest(tmp_path, wheel), [f"{WHEEL}={wheel}"])
    assert made["stack"] == "sglang-0.5.23"
    (row,) = made["made_from"]
    assert row["series_digest"] == "d" * 64
    assert "record_sha256" not in row


def test_an_unpacked_tree_is_checked_against_its_record(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    tree = tmp_path / "tree"
    zipfile.ZipFile(wheel).extractall(tree)
    (tree / "sglang/srt/layer.py").unlink()  # a part the call did not carry
    made = provenance.layer_provenance(_manifest(tmp_path, wheel), [f"{WHEEL}={tree}"])
    (row,) = made["made_from"]
    record = (tree / "sglang-0.5.23+sm120.1.dist-info/RECORD").read_bytes()
    assert row["record_sha256"] == hashlib.sha256(record).hexdigest()
    assert (row["files_checked"], row["files_not_carried"]) == (1, 1)
    (tree / "sglang/__init__.py").write_text("x = 2\n")
    with pytest.raises(ConfigError, match="differs from"):
        provenance.layer_provenance(_manifest(tmp_path, wheel), [f"{WHEEL}={tree}"])


def test_another_wheel_than_the_manifests_is_refused(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    manifest = _manifest(tmp_path, wheel)
    other = tmp_path / "other" / WHEEL
    other.parent.mkdir()
    other.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(ConfigError, match="is not the"):
        provenance.layer_provenance(manifest, [f"{WHEEL}={other}"])
    with pytest.raises(ConfigError, match="needs --manifest"):
        provenance.layer_provenance(None, [f"{WHEEL}={wheel}"])


def test_the_layer_report_records_stack_made_from_and_whether_it_finished(
        tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    made = provenance.layer_provenance(_manifest(tmp_path, wheel), [f"{WHEEL}={wheel}"])
    opts = runs.LayerOptions(command="x", sglang_path=tmp_path, out=tmp_path / "out",
                             layout="layer_boundary")
    runs._write_sglang_layer_report(opts, [], done=False, planned=["fused"], made=made)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["stack"] == "sglang-0.5.23"
    assert doc["made_from"] == made["made_from"]
    assert doc["finished"] is False
    assert doc["planned"] == ["fused"]
