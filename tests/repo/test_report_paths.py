"""Committed reports name no folder of the machine that made them (DEVELOPERS.md: "Reports
and hints carry no absolute path"): checkouts, scratch folders, home folders and Python
environments appear by role (``<out>``, ``<tmp>``, ``<gpu-python>``, ...) or relative to the
checkout.  A toolkit's install location that a report states as a fact (``/usr/local/cuda``,
where the doctor found nvcc) is not a folder of the run, and is not matched."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: An absolute path into a folder that only the machine of the run had.
MACHINE_PATH = re.compile(r"(?<![\w<>.-])/(?:opt|root|work|home|tmp)/[\w.+-]")


def machine_paths(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "reports").rglob("*")):
        if not path.is_file() or path.suffix in (".png", ".tgz", ".gz", ".xz", ".whl"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if match := MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(root).as_posix()}:{number}: "
                             f"{line[max(0, match.start() - 20):match.end() + 40]}")
                break
    return found


def test_committed_reports_hold_no_machine_paths() -> None:
    assert machine_paths(REPO) == []


def test_a_machine_path_is_found(tmp_path: Path) -> None:
    (tmp_path / "reports" / "gpu").mkdir(parents=True)
    log = tmp_path / "reports" / "gpu" / "run.log"
    log.write_text("+ <gpu-python> -m pip install --target <tmp>/site .device/x.whl\n"
                   "nvcc: /usr/local/cuda/bin/nvcc\n")
    assert machine_paths(tmp_path) == []
    log.write_text(log.read_text() + "wrote /tmp/tmp.wowS8QxSoQ/report/bench.json\n")
    assert machine_paths(tmp_path) == [
        "reports/gpu/run.log:3: wrote /tmp/tmp.wowS8QxSoQ/report/bench.json"]
    log.write_text("+ /opt/torch/.venv/bin/python3 -m pip\n")
    assert len(machine_paths(tmp_path)) == 1
