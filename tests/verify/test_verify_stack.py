"""run_verify end to end on a tiny stack: every patch's fingerprint in the built wheel, and
the evidence its Verified-By names, run (no nvcc, no network: cpu: evidence only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120fork import record
from sm120fork.patch.series import load_series
from sm120fork.verify.proof.patches import NO_EVIDENCE
from sm120fork.verify.proof.stack import run_verify, write_reports

from helpers_maintain import count_series_loads
from helpers_ws import STACK, make_demo

GATE_TEST = "tests/test_gate.py::test_the_gate_allows_12"
pytestmark = pytest.mark.slow


def _claim_cpu_evidence(series: Path, test_body: str, root: Path) -> None:
    patch = next(p for p in sorted(series.glob("*.patch")) if "F1" in p.read_text())
    claim = f"Forwarded: no\nVerified-By: cpu:{GATE_TEST}\n"
    patch.write_text(patch.read_text().replace("Forwarded: no\n", claim, 1))
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "test_gate.py").write_text(
        f"def test_the_gate_allows_12() -> None:\n    {test_body}\n")


def test_run_verify_checks_fingerprints_and_runs_the_named_evidence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = make_demo(tmp_path)
    _claim_cpu_evidence(demo.series_dir("lib"), "assert 12 in [9, 10, 12]", demo.ws.root)
    result = run_verify(demo.ws, demo.ws.stack(STACK))
    assert result.passed
    by_subject = {v.subject.split()[0]: v for v in result.verdicts}
    assert set(by_subject) == {"F1", "F3", "S1"}
    f1 = by_subject["F1"]
    assert f1.evidence == "CPU behaviour check"
    assert f1.checks[0].startswith("fingerprint in wheel, absent upstream (1 string(s)): pass")
    assert f1.checks[1].startswith(f"[cpu:{GATE_TEST}] {GATE_TEST}: passed")
    assert by_subject["F3"].evidence == NO_EVIDENCE
    assert by_subject["F3"].passed
    assert {p.project for p in result.provenance} == {"lib", "app"}
    assert all(len(p.wheel_sha256) == 64 for p in result.provenance)
    # The record names the patches of the run's own plan: no series is read again.
    loaded = count_series_loads(monkeypatch)
    folder = write_reports(demo.ws, result)
    assert loaded == []
    rec = record.read(folder / record.RECORD_FILE)
    assert [(p.project, p.patch, p.patch_id) for p in rec.tested.patches] == [
        (key, p.name, p.patch_id) for key in ("lib", "app")
        for p in load_series(demo.series_dir(key)).patches]


def test_failing_evidence_fails_the_patch_and_the_run(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    _claim_cpu_evidence(demo.series_dir("lib"), "assert 12 in [9, 10], 'gate refuses 12'",
                        demo.ws.root)
    result = run_verify(demo.ws, demo.ws.stack(STACK))
    assert not result.passed
    f1 = next(v for v in result.verdicts if v.subject.startswith("F1"))
    assert not f1.passed
    assert "failed: AssertionError: gate refuses 12" in f1.checks[1]
    assert all(v.passed for v in result.verdicts if not v.subject.startswith("F1"))
