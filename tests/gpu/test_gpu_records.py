"""A GPU run's record (kind gpu-test): what was tested, each case, and the verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers_manifest import entry
from sm120fork import record, resolved
from sm120fork.gpu.ab import run as ab_run
from sm120fork.gpu.ab.results import AbRun
from sm120fork.gpu.core import records
from sm120fork.gpu.core.safety import COMMAND_ENV
from sm120fork.gpu.layer import run as layer_run
from sm120fork.manifest import Manifest
from sm120fork.util import typed

PATCHED = "flashinfer_python-0.6.7.post3+sm120.1-py3-none-any.whl"
UPSTREAM = "flashinfer_python-0.6.7.post3-py3-none-any.whl"


def _rec(key: str, status: str, **extra: Any) -> dict[str, Any]:
    case = {"api": "fusion_unified", "world_size": 2, "pattern": "ar_rmsnorm", "tokens": 8,
            "hidden": 4096, "dtype": "bf16", "strategy": "oneshot", "pdl": False}
    check = {"output": "norm_out", "stage": "eager", "ok": True, "rel_l2": 2.3e-3}
    return {"key": key, "status": status, "case": case, "checks": [check], **extra}


def _doc(patched: list[dict[str, Any]], unpatched: list[dict[str, Any]],
         compiled: bool = True) -> AbRun:
    return AbRun.read({
        "kind": "gpu-test", "created": "2026-12-03T17:00:00+00:00",
        "command": "nox -s gpu_test -- --stack sglang-0.5.10 --quick",
        "environment": {"gpus": ["NVIDIA H200"], "gpu_count": 1, "capability": [9, 0],
                        "torch": "2.11.0", "torch_cuda": "13.0", "python": "3.12.3",
                        "driver": "580.159.04",
                        "flashinfer_path": "/root/work/.device/abrun/site/flashinfer",
                        "wheels_manifest": {"stack": "sglang-0.5.10", "toolkit_version": "0",
                                            "wheels": [entry("flashinfer", wheel=PATCHED)]}},
        "shared": True, "primary": "patched", "baseline": "unpatched",
        "variants": {"patched": {"wheel": PATCHED, "sha256": "a" * 64,
                                 "site": "/tmp/x/site", "compiled": True},
                     "unpatched": {"wheel": UPSTREAM, "sha256": "b" * 64,
                                   "compiled": compiled}},
        "results": {"patched": patched, "unpatched": unpatched},
        "not_run": ["FP4 patterns: need sm_100 or newer"],
    }, "test-ab.json")


TESTED = record.Tested(
    trees=(record.TestedTree(project="flashinfer", tree="c" * 40),),
    patches=(record.TestedPatch(project="flashinfer", patch="0002-F1.patch",
                                patch_id="d" * 40),))


def _manifest(*entries: dict[str, Any]) -> Manifest:
    return Manifest.from_json({"stack": "s", "toolkit_version": "0", "wheels": list(entries)})


def _patches(*names: str) -> list[dict[str, str]]:
    return [{"name": n, "sha256": "0" * 64, "subject": n} for n in names]


def test_an_ab_run_is_a_record_of_each_variants_cases() -> None:
    doc = _doc([_rec("a", "pass"), _rec("b", "pass"), _rec("c", "skip", reason="needs sm_100")],
               [_rec("a", "fail", reason="wrong sum"), _rec("b", "pass"),
                _rec("c", "skip", reason="needs sm_100")])
    rec = ab_run.test_record(doc, TESTED)
    assert rec is not None
    assert (rec.kind, rec.stack, rec.verdict, rec.finished) == (
        "gpu-test", "sglang-0.5.10", "pass", True)
    assert rec.planned == 6
    assert rec.counts == {"pass": 3, "fail": 1, "skip": 2, "error": 0}
    mine = {c.id: c.against for c in rec.cases if c.variant == "patched"}
    assert mine == {"a": "fixed", "b": "pass-both", "c": None}
    assert {w.variant for w in rec.tested.wheels} == {"patched", "upstream"}
    assert rec.tested.patches[0].patch_id == "d" * 40
    assert rec.machine.description == "NVIDIA H200 x1"
    assert rec.machine.shared_gpu is True
    text = record.dumps(rec)
    assert "/root" not in text
    assert "/tmp" not in text  # the doc's machine paths stay out of the record


def test_a_run_whose_module_did_not_build_is_unfinished_not_zero_failing() -> None:
    build = {"failure": "build", "reason": "JIT build failed"}
    doc = _doc([_rec("a", "pass")], [_rec("a", "fail", **build)], compiled=False)
    rec = ab_run.test_record(doc, TESTED)
    assert rec is not None
    assert rec.verdict == "unfinished"
    assert any("never ran" in n for n in rec.notes)


def test_wheels_of_no_stack_make_no_record() -> None:
    doc = _doc([_rec("a", "pass")], [_rec("a", "pass")])
    doc.environment["wheels_manifest"] = None
    assert ab_run.test_record(doc, None) is None


def test_the_record_comes_back_with_one_import(tmp_path: Path) -> None:
    rec = ab_run.test_record(_doc([_rec("a", "pass")], [_rec("a", "fail", reason="x")]),
                              TESTED)
    assert rec is not None
    records.write(rec, tmp_path / "box-out" / "s510")
    published = record.import_records(tmp_path / "box-out", tmp_path / "reports")
    assert published == [tmp_path / "reports" / "sglang-0.5.10" / "gpu-test"]


def test_the_recorded_command_names_no_path_of_this_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")
    argv = ["test", "--stack", "sglang-0.5.10", "--quick", "--out", "/tmp/o",
            "--work-dir=/tmp/w"]
    assert records.recorded_command("test", argv) == (
        "nox -s gpu_test -- --stack sglang-0.5.10 --quick")
    monkeypatch.setenv(COMMAND_ENV, "sh <kit sglang-0.5.10>/run gpu_test --quick")
    assert records.recorded_command("test", argv).startswith("sh <kit")


def test_tested_of_a_build_names_the_patches_it_applied_with_their_ids() -> None:
    manifest = _manifest(
        entry("flashinfer", tree="c" * 40, patched_commit="e" * 40,
              patches=_patches("0001-a.patch", "0002-b.patch")),
        entry("sglang", used_as_published=True))
    ids = {"flashinfer": [("0001-a.patch", "1" * 40), ("0002-b.patch", "2" * 40)]}
    assert typed.dump(resolved.tested_of(manifest, ids)) == {
        "wheels": [],
        "trees": [{"project": "flashinfer", "tree": "c" * 40}],
        "patches": [{"project": "flashinfer", "patch": "0001-a.patch", "patch_id": "1" * 40},
                    {"project": "flashinfer", "patch": "0002-b.patch", "patch_id": "2" * 40}]}
    assert resolved.tested_of(manifest, {}).patches == ()  # no series here: no patches


def test_a_layer_run_of_a_stack_is_a_record_unfinished_until_every_case_ran() -> None:
    from sm120fork.layouts import CaseOutcome

    made = {"stack": "sglang-0.5.23", "made_from": [
        {"project": "sglang", "wheel": "sglang-0.5.23+sm120.1-py3-none-any.whl",
         "wheel_sha256": "e" * 64}]}

    def outcome(case: str, passed: bool) -> CaseOutcome:
        return CaseOutcome(case=case, passed=passed, hung=False,
                           problems=[] if passed else ["rank 1 hung"], ranks=[],
                           seconds=12.0, tails=[])

    common: dict[str, Any] = {
        "made": made, "tested": TESTED, "command": "nox -s sglang_layer -- --stack x",
        "created": "2026-12-03T17:00:00+00:00",
        "machine": {"gpus": ["NVIDIA H200"], "torch": "2.11.0"},
        "planned": ["fused", "fault-bad-ptr"]}
    part = layer_run.layer_record(**common, outcomes=[outcome("fused", True)])
    assert part is not None
    assert part.verdict == "unfinished"
    whole = layer_run.layer_record(**common, outcomes=[outcome("fused", True),
                                                    outcome("fault-bad-ptr", False)])
    assert whole is not None
    assert (whole.kind, whole.verdict, whole.counts["fail"]) == ("sglang-layer", "fail", 1)
    assert whole.cases[1].detail == "rank 1 hung"
    assert layer_run.layer_record(**{**common, "made": {"stack": None, "made_from": []}},
                                outcomes=[]) is None


def test_an_ab_of_the_flashinfer_wheel_tested_none_of_the_sglang_series() -> None:
    """The A/B runs the stack's FlashInfer wheel only: a change to an SGLang patch must not
    make its record stale, so the record names FlashInfer's trees and patches alone."""
    tested = record.Tested(
        trees=(*TESTED.trees, record.TestedTree(project="sglang", tree="e" * 40)),
        patches=(*TESTED.patches, record.TestedPatch(project="sglang", patch="0001-S1.patch",
                                                     patch_id="f" * 40)))
    rec = ab_run.test_record(_doc([_rec("a", "pass")], [_rec("a", "fail")]), tested)
    assert rec is not None
    assert rec.tested.projects == ("flashinfer",)
    assert {p.project for p in rec.tested.patches} == {"flashinfer"}
    assert {t.project for t in rec.tested.trees} == {"flashinfer"}


def test_an_ab_summary_counts_each_variant_apart() -> None:
    """'pass (279 pass, 95 fail, ...)' summed the baseline's failures into the verdict line."""
    doc = _doc([_rec("a", "pass"), _rec("b", "pass")],
               [_rec("a", "fail", reason="wrong sum"), _rec("b", "pass")])
    rec = ab_run.test_record(doc, TESTED)
    assert rec is not None
    verdict = next(line for line in record.summary(rec).splitlines() if "Verdict" in line)
    assert "patched: 2 pass, 0 fail" in verdict
    assert "upstream (baseline): 1 pass, 1 fail" in verdict


def test_a_regressed_case_fails_the_run_and_a_case_not_run_leaves_it_unfinished() -> None:
    """Moved from gpu.report.to_record's test when that second converter went."""
    doc = _doc([_rec("a", "pass"), _rec("b", "fail", reason="wrong sum")],
               [_rec("a", "pass"), _rec("b", "pass")])
    rec = ab_run.test_record(doc, TESTED)
    assert rec is not None
    assert rec.verdict == "fail"
    assert [c.against for c in rec.cases if c.variant == "patched"] == ["pass-both",
                                                                        "regressed"]
    assert record.from_json(json.loads(record.dumps(rec)), "x") == rec
    doc = _doc([_rec("a", "pass"), _rec("b", "skip", reason="no", not_run=True)],
               [_rec("a", "pass"), _rec("b", "pass")])
    rec = ab_run.test_record(doc, TESTED)
    assert rec is not None
    assert rec.verdict == "unfinished"  # a planned case did not run


def test_a_build_of_several_wheels_names_each_tree_and_patch_once() -> None:
    """An SGLang build makes one wheel per Python and platform, each listing the same
    tree and patches: the record's tested block (and its summary) names each once."""

    one = entry("sglang", tree="t1", patched_commit="c1", patches=_patches("0001-a.patch"))
    got = resolved.tested_of(_manifest(one, one, one), {"sglang": [("0001-a.patch", "a" * 40)]})
    assert got == record.Tested(
        trees=(record.TestedTree(project="sglang", tree="t1"),),
        patches=(record.TestedPatch(project="sglang", patch="0001-a.patch",
                                    patch_id="a" * 40),))


def test_a_tested_json_that_is_not_one_is_refused_naming_the_file_and_key(
        tmp_path: Path) -> None:
    """The kit's tested.json is read through the record's reader: a malformed patch row
    names the file and the dotted key instead of a KeyError deep in the record."""
    from sm120fork.errors import ConfigError

    folder = tmp_path / "stack"
    folder.mkdir()
    assert records.tested_beside(folder) is None  # none there: a run of no stack's build
    good = typed.dump(TESTED)
    (folder / records.TESTED_FILE).write_text(json.dumps(good))
    assert records.tested_beside(folder) == TESTED
    bad = {**good, "patches": [{"project": "flashinfer", "patch": "0002-F1.patch"}]}
    (folder / records.TESTED_FILE).write_text(json.dumps(bad))
    with pytest.raises(ConfigError) as err:
        records.tested_beside(folder)
    assert err.value.where == f"{folder / records.TESTED_FILE}: patches[0].patch_id"
    assert "missing" in str(err.value)
