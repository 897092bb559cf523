"""Reports carry no machine path, and GPU reports record what they were made from."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from helpers_manifest import entry
from sm120fork.gpu.ab.results import AbRun, write_test_report
from sm120fork.gpu.core.documents import VariantInfo
from sm120fork.gpu.core.report import made_from
from sm120fork.manifest import Manifest
from sm120fork.util.portable import machine_roles, portable, portable_text


def test_paths_become_relative_or_named_by_role(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    roles = machine_roles(root, {"gpu-work": tmp_path / "gpu", "out": root / "reports/gpu/x"})
    text = (f'File "{root}/src/a.py", cwd {root}; site {tmp_path}/gpu/patched/site; '
            f"--out {root}/reports/gpu/x; {root}x stays; {Path.home()}/.cache")
    assert portable_text(text, roles) == (
        'File "src/a.py", cwd .; site <gpu-work>/patched/site; --out reports/gpu/x; '
        f"<tmp>{str(root)[len(tempfile.gettempdir()):]}x stays; ~/.cache")
    assert portable({"a": [f"{root}/b", 1]}, roles) == {"a": ["b", 1]}


def test_gpu_reports_record_their_wheel_and_hold_no_machine_path(tmp_path: Path) -> None:
    root, work = tmp_path / "checkout", tmp_path / "gpu-work"
    manifest = {"stack": "demo", "toolkit_version": "0", "wheels": [
        entry("lib", series="patches/demo/lib", series_digest="d" * 64,
              wheel="lib-1.0+sm120.1-py3-none-any.whl", sha256="a" * 64),
        entry("app", series="patches/demo/app", series_digest="e" * 64,
              wheel="app-1.0+sm120.1-py3-none-any.whl", sha256="b" * 64)]}
    built = Manifest.from_json(manifest)
    doc = {"primary": "patched", "command": f"python -m sm120fork.gpu test --work-dir {work}",
           "environment": {"wheels_manifest": manifest},
           "variants": {"patched": {"sha256": "a" * 64, "site": f"{work}/patched/site",
                                    "compile_failure": f'File "{root}/src/w.py", line 1'}},
           "results": {"patched": []}}
    out = root / "reports" / "gpu" / "x"
    roles = machine_roles(root, {"gpu-work": work, "out": out})
    write_test_report(AbRun.read(doc, "test-ab.json"), out, roles)
    written = json.loads((out / "test-ab.json").read_text())
    assert written["stack"] == "demo"
    assert written["made_from"] == [{
        "project": "lib", "series": "patches/demo/lib", "series_digest": "d" * 64,
        "wheel": "lib-1.0+sm120.1-py3-none-any.whl", "wheel_sha256": "a" * 64}]
    assert written["command"] == "python -m sm120fork.gpu test --work-dir <gpu-work>"
    assert written["variants"]["patched"]["compile_failure"] == 'File "src/w.py", line 1'
    assert written["variants"]["patched"]["site"] == "<gpu-work>/patched/site"
    for path in out.iterdir():
        assert str(tmp_path) not in path.read_text(), path
    # A wheel that is no toolkit build claims nothing.
    claimed = made_from(built, {"sha256": "c" * 64})
    assert (claimed["stack"], claimed["made_from"]) == ("demo", [])
    # A published wheel too large to carry, zipped again from its checked tree: other
    # bytes, same name and RECORD; recorded so that upstream_pr can check the RECORD.
    rezipped: VariantInfo = {"wheel": "app-1.0+sm120.1-py3-none-any.whl", "sha256": "e" * 64,
                             "record_sha256": "f" * 64}
    assert made_from(built, rezipped)["made_from"] == [{
        "project": "app", "series": "patches/demo/app", "series_digest": "e" * 64,
        "wheel": "app-1.0+sm120.1-py3-none-any.whl", "wheel_sha256": "b" * 64,
        "tested_sha256": "e" * 64, "record_sha256": "f" * 64}]
