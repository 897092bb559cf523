"""Per-patch evidence from ``Verified-By`` headers, and the committed report's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sm120fork.errors import SeriesError
from sm120fork.patch.series import parse_patch
from sm120fork.standing import Claim, claims
from sm120fork.verify.proof.patches import (
    NO_EVIDENCE,
    VERIFY_STACK_ENV,
    Context,
    Outcome,
    check,
    check_behaviour,
    check_cpu_test,
    check_gpu_report,
    evidence_label,
    run_cpu_tests,
    suite_node,
)
from sm120fork.verify.proof.stack import NAMES_SHOWN, compact

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: SM12x fork maintainers <sm12x-fork@users.noreply.invalid>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: [PATCH] F9 comm: something

Description: Something.
Origin: vendor, sm120fork
Forwarded: no
Last-Update: 2026-11-29
Fingerprint: a.txt: new
{verified}
---
 a.txt | 1 +
 1 file changed, 1 insertion(+)

diff --git a/a.txt b/a.txt
index 0000000000000000000000000000000000000000..1111111111111111111111111111111111111111 100644
--- a/a.txt
+++ b/a.txt
@@ -0,0 +1 @@
+new
"""


def patch_with(tmp_path: Path, verified: str) -> Any:
    path = tmp_path / "0001-x.patch"
    path.write_text(PATCH.format(verified=verified))
    return parse_patch(path)


def test_verified_by_fields_are_parsed_in_order(tmp_path: Path) -> None:
    patch = patch_with(tmp_path, "Verified-By: proof:cluster-query\n"
                                 "Verified-By: gpu:gpu-scenario/f5-cluster")
    assert claims(patch) == (Claim(kind="proof", check="cluster-query"),
                             Claim(kind="gpu", check="gpu-scenario/f5-cluster"))


@pytest.mark.parametrize("bad", ["Verified-By: cluster-query", "Verified-By: ci:x",
                                 "Verified-By: proof:", "Verified-By: gpu:reports/s/gpu-test"])
def test_a_malformed_verified_by_names_the_patch(tmp_path: Path, bad: str) -> None:
    patch = patch_with(tmp_path, bad)
    with pytest.raises(SeriesError, match="bad Verified-By") as info:
        claims(patch)
    assert "0001-x.patch" in str(info.value)


def test_no_claim_means_no_evidence_yet() -> None:
    assert evidence_label([]) == NO_EVIDENCE
    outcomes = [Outcome(claim="proof:jit-gate", evidence="compile proof", text="", passed=True),
                Outcome(claim="gpu:x", evidence="SM90 GPU run", text="", passed=True),
                Outcome(claim="proof:kernel-bodies", evidence="compile proof", text="",
                        passed=True)]
    assert evidence_label(outcomes) == "compile proof + SM90 GPU run"


def test_cpu_evidence_is_a_test_that_ran_and_passed(tmp_path: Path) -> None:
    """A ``cpu:`` claim is run and its outcome recorded: existing is not enough (the check
    used to pass for a skipped or failing test that merely exists)."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest\n\n"
        "def test_real() -> None:\n    pass\n\n"
        "def test_skipped() -> None:\n    pytest.skip('needs the package index')\n\n"
        "def test_failing() -> None:\n    assert 1 == 2, 'the patch regressed'\n")
    nodes = [f"tests/test_x.py::{n}" for n in ("test_real", "test_skipped", "test_failing",
                                                "test_renamed")]
    results = run_cpu_tests(tmp_path, [*nodes, "tests/test_y.py::test_real"])
    assert results[nodes[0]][1]
    assert results[nodes[0]][0].startswith("passed")
    assert results[nodes[1]] == ("skipped: needs the package index", False)
    assert not results[nodes[2]][1]
    assert results[nodes[2]][0].startswith("failed: AssertionError: the patch regressed")
    assert results[nodes[3]] == ("tests/test_x.py::test_renamed: no such test", False)
    assert not results["tests/test_y.py::test_real"][1]
    ctx = Context(root=tmp_path, cpu=results)
    assert check_cpu_test(ctx, nodes[1]) == (
        "tests/test_x.py::test_skipped: skipped: needs the package index", False)
    assert check_cpu_test(Context(root=tmp_path), nodes[0])[1]  # run on its own


def test_a_cpu_test_of_another_stacks_build_backs_nothing_for_this_stack(
        tmp_path: Path) -> None:
    """Issue 29: a claim whose test runs another stack's build (the suite's fixture that
    installs sglang 0.5.23, whatever stack is verified) does not count, and says why."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        for mark in item.iter_markers('runs_stack'):\n"
        "            item.user_properties.append(('runs_stack', mark.args[0]))\n")
    (tests / "test_x.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.runs_stack('sglang-0.5.23')\n"
        "def test_on_0523() -> None:\n    pass\n\n"
        "def test_of_no_stack() -> None:\n    pass\n")
    on_0523, anywhere = "tests/test_x.py::test_on_0523", "tests/test_x.py::test_of_no_stack"
    results = run_cpu_tests(tmp_path, [on_0523, anywhere], stack="sglang-0.5.22")
    assert results[on_0523] == (
        "ran stack sglang-0.5.23's build, not sglang-0.5.22's: it does not count for stack "
        "sglang-0.5.22 (the test builds a stack by name: let it build the one "
        "SM120FORK_VERIFY_STACK names, as tests/helpers_sglang.py does)", False)
    assert results[anywhere][1]
    assert run_cpu_tests(tmp_path, [on_0523], stack="sglang-0.5.23")[on_0523][1]
    text, ok = check_cpu_test(Context(root=tmp_path, stack="sglang-0.5.22"), on_0523)
    assert not ok
    assert "does not count for stack sglang-0.5.22" in text


def test_a_cpu_test_runs_for_the_stack_verified(tmp_path: Path) -> None:
    """Issue 41: a claim names a check, not a stack.  verify runs a claim's test for the
    stack it verifies (its fixtures build that stack's series: tests/helpers_sglang.py),
    so the test of a stack-relative fixture counts for a copy of the stack under another
    name, as it does for the original."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(
        "import os\n\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        item.user_properties.append(\n"
        f"            ('runs_stack', os.environ.get({VERIFY_STACK_ENV!r}, 'sglang-0.5.23')))\n")
    (tests / "test_x.py").write_text("def test_g6() -> None:\n    pass\n")
    node = "tests/test_x.py::test_g6"
    for stack in ("sglang-0.5.23", "sglang-next"):
        text, ok = run_cpu_tests(tmp_path, [node], stack=stack)[node]
        assert ok, text


def test_a_cpu_claim_finds_its_test_module_in_the_stage_folder(tmp_path: Path) -> None:
    """``cpu:tests/test_x.py::t`` (as the committed patches write it) runs the module that
    moved to ``tests/<stage>/test_x.py``; an ambiguous or absent name backs nothing."""
    stage = tmp_path / "tests" / "gpu"
    stage.mkdir(parents=True)
    (stage / "test_x.py").write_text("def test_real() -> None:\n    pass\n")
    for other in ("plugin", "cli"):
        (tmp_path / "tests" / other).mkdir()
        (tmp_path / "tests" / other / "test_twice.py").write_text(
            "def test_real() -> None:\n    pass\n")
    assert suite_node(tmp_path, "tests/test_x.py::test_real") == "tests/gpu/test_x.py::test_real"
    results = run_cpu_tests(tmp_path, ["tests/test_x.py::test_real",
                                       "tests/gpu/test_x.py::test_real",
                                       "tests/test_twice.py::test_real"])
    assert results["tests/test_x.py::test_real"][0].startswith("passed"), results
    assert results["tests/gpu/test_x.py::test_real"][0].startswith("passed"), results
    assert results["tests/test_twice.py::test_real"] == (
        "tests/test_twice.py::test_real: no such test file", False)


def _gpu_record(reports: Path, statuses: dict[str, tuple[str, str | None]], *,
                stack: str = "s", patch_ids: tuple[str, ...] = ()) -> Path:
    """A gpu-test record of ``stack``: case -> (outcome, how it compares with the baseline)."""
    from sm120fork.record import Case, Machine, Tested, TestedPatch, make, write

    rec = make(kind="gpu-test", stack=stack, command="nox -s gpu_test -- --stack s --quick",
               created="2026-12-02T17:57:35+00:00", toolkit="0", machine=Machine(
                   description="NVIDIA H200 x1"),
               tested=Tested(patches=tuple(TestedPatch(project="flashinfer", patch=f"{i}.patch",
                                                       patch_id=pid)
                                           for i, pid in enumerate(patch_ids))),
               planned=len(statuses),
               cases=tuple(Case(id=key, variant="patched", outcome=outcome,
                                detail="FP4" if outcome == "skip" else "", against=against)
                           for key, (outcome, against) in statuses.items()))
    return write(rec, reports)


def test_gpu_report_check_reads_the_committed_record(tmp_path: Path) -> None:
    _gpu_record(tmp_path / "reports", {
        "custom_lamport/t1": ("pass", "fixed"), "fusion_unified/t1": ("pass", "pass-both"),
        "fusion_unified/t2": ("skip", None)})
    ctx = Context(root=tmp_path, stack="s")
    text, ok = check_gpu_report(ctx, "gpu-test:custom_lamport")
    assert ok
    assert "1 custom_lamport cases ran, 0 failing, 1 fixed" in text
    assert not check_gpu_report(ctx, "gpu-test:fusion_unified")[1]  # none fixed
    assert check_gpu_report(ctx, "gpu-test")[1]  # no API named: "none failing"
    assert not check_gpu_report(ctx, "bench")[1]
    _gpu_record(tmp_path / "reports", {"custom_lamport/t1": ("fail", "fail-both")},
                stack="t")
    assert not check_gpu_report(Context(root=tmp_path, stack="t"), "gpu-test")[1]


def test_a_gpu_record_counts_only_for_its_stack_and_the_patch_as_it_is(
        tmp_path: Path) -> None:
    """A claim names the stack's own record: another stack's run backs nothing (issues 29
    and 41); neither does a run made before the patch's change; a reworded header does
    not matter."""
    patch = patch_with(tmp_path, "Verified-By: gpu:gpu-test")
    _gpu_record(tmp_path / "reports", {"custom_lamport/t1": ("pass", "fixed")},
                stack="other", patch_ids=(patch.patch_id,))
    text, ok = check_gpu_report(Context(root=tmp_path, stack="s"), "gpu-test", patch,
                                "flashinfer")
    assert (text, ok) == ("reports/s/gpu-test: no record.json", False)
    assert check_gpu_report(Context(root=tmp_path, stack="other"), "gpu-test", patch,
                            "flashinfer")[1]
    _gpu_record(tmp_path / "reports", {"custom_lamport/t1": ("pass", "fixed")},
                patch_ids=(patch.patch_id,))
    ctx = Context(root=tmp_path, stack="s")
    assert check_gpu_report(ctx, "gpu-test", patch, "flashinfer")[1]
    reworded = tmp_path / "reworded.patch"
    reworded.write_text(patch.path.read_text().replace("Description: ", "Description: Now ",
                                                       1))
    assert check_gpu_report(ctx, "gpu-test", parse_patch(reworded), "flashinfer")[1]
    changed = tmp_path / "changed.patch"
    changed.write_text(patch.path.read_text().replace("+new", "+newer"))
    text, ok = check_gpu_report(ctx, "gpu-test", parse_patch(changed), "flashinfer")
    assert not ok
    assert "made before this patch's change" in text


def test_behaviour_claims_need_checks_that_ran_and_passed(tmp_path: Path) -> None:
    ctx = Context(root=tmp_path, behaviour=(("S1 tp2", "12.0", True), ("S2 tp4", "12.0", False)))
    assert check_behaviour(ctx, "S1")[1]
    assert not check_behaviour(ctx, "S2")[1]
    assert not check_behaviour(ctx, "S9")[1]


def test_proof_claims_fail_without_a_proof_or_with_an_unknown_check(tmp_path: Path) -> None:
    ctx = Context(root=tmp_path)
    for name in ("jit-gate", "kernel-bodies", "cluster-query", "no-such-check"):
        assert not check(Claim(kind="proof", check=name), ctx).passed


def test_compact_keeps_verdicts_and_counts_but_not_kernel_lists() -> None:
    names = [f"kernel{i}" for i in range(480)]
    document: dict[str, Any] = {
        "passed": True,
        "verdicts": [{"variant": "F1 only", "arch": "sm_120a", "status": "fail",
                      "missing": [], "empty": names, "pdl_lost": names[:3]}],
        "proof": {"variants": [{"name": "F1 only", "archs": [{"arch": "sm_120a", "units": [
            {"source": "csrc/x.cu", "seconds": 1.0, "kernels": [{"name": n} for n in names]}]}]}]},
    }
    out = compact(document)
    verdict = out["verdicts"][0]
    assert verdict["status"] == "fail"
    assert verdict["empty"] == {"count": 480, "first": names[:NAMES_SHOWN]}
    assert verdict["pdl_lost"] == {"count": 3, "first": names[:3]}
    unit = out["proof"]["variants"][0]["archs"][0]["units"][0]
    assert unit["kernel_count"] == 480
    assert "kernels" not in unit
    assert len(document["verdicts"][0]["empty"]) == 480  # the input is left whole


def test_portable_names_machine_folders_by_role() -> None:
    from sm120fork.verify.proof.stack import portable

    root = Path("/home/me/checkout")
    flags = ["-isystem", "/home/me/.venv/lib/python3.11/site-packages/tvm_ffi/include",
             "-isystem", "/root/.pyenv/versions/3.11.7/include/python3.11",
             "-isystem", "/usr/local/include/cccl",
             "-isystem", "/home/me/checkout/.forks/trees/s/flashinfer@unpatched/include"]
    out = portable({"flags": flags, "n": 3}, root)
    assert out["flags"][1] == "<site-packages>/tvm_ffi/include"
    assert out["flags"][3] == "<python-include>"
    assert out["flags"][5] == "<system-include>/cccl"
    assert out["flags"][7] == ".forks/trees/s/flashinfer@unpatched/include"
    assert out["n"] == 3
    assert "/home/" not in json.dumps(out)


def test_a_verify_run_becomes_its_record() -> None:
    """The verify-sm120 record: a case per patch, behaviour check and proof verdict; the
    baselines' verdicts fail on purpose and judge nothing; the wheels, trees and patch ids
    it was made from are what staleness compares.  Made from the run's typed result (it
    went through the report's JSON and back by string keys)."""
    from sm120fork.layouts.results import CheckResult
    from sm120fork.record import TestedPatch
    from sm120fork.verify.proof.run import ProofReport, Status, Verdict
    from sm120fork.verify.proof.stack import PatchVerdict, Provenance, VerifyResult, to_record

    def verdict(variant: str, arch: str, status: Status, *reasons: str) -> Verdict:
        return Verdict(variant=variant, arch=arch, status=status, reasons=reasons,
                       reference_kernels=1, present=1, missing=(), empty=(),
                       pdl_reference=None, pdl=None, pdl_lost=())

    class Proof(ProofReport):
        def verdicts(self) -> list[Verdict]:
            return [verdict("unpatched", "sm_120f", Status.FAIL, "JIT gate refuses"),
                    verdict("full series", "sm_120f", Status.PASS),
                    verdict("F1 only", "sm_121a", Status.NOT_CHECKED)]

    root = Path("/home/me/checkout")
    patch = TestedPatch(project="flashinfer", patch="0002-F1.patch", patch_id="1" * 40)
    result = VerifyResult(
        stack="s", seconds=949.96,
        provenance=(Provenance(project="flashinfer", series="patches/s/flashinfer",
                               series_digest="d" * 64, wheel="f.whl",
                               wheel_sha256="a" * 64, tree="t" * 40),),
        verdicts=(PatchVerdict(project="flashinfer", patch="0002-F1.patch", subject="F1",
                               checks=(), artifact="", passed=True,
                               evidence=f"compile proof ({root}/.forks/x)"),),
        sglang=(CheckResult(name="S1 tp2", capability="12.0", expected="", observed="",
                            passed=True, detail=""),),
        proof=Proof(variants=(), archs=(), reference_arch="sm_90a", nvcc_version="",
                    pdl_opcodes=(), wall_seconds=0.0),
        patches=(patch,))
    rec = to_record(result, root, created="2026-12-02T00:00:00+00:00")
    assert rec.cases[0].detail == "compile proof (.forks/x)"
    assert rec.notes == ("took 950 s",)
    assert (rec.kind, rec.stack, rec.verdict, rec.finished) == ("verify-sm120", "s", "pass",
                                                                True)
    assert [(c.id, c.variant, c.outcome) for c in rec.cases] == [
        ("flashinfer/0002-F1.patch", "full series", "pass"),
        ("sglang/S1 tp2@12.0", "full series", "pass"),
        ("proof/unpatched/sm_120f", "baseline", "fail"),
        ("proof/full series/sm_120f", "full series", "pass"),
        ("proof/F1 only/sm_121a", "baseline", "skip")]
    assert rec.tested.trees[0].tree == "t" * 40
    assert rec.tested.patches == (patch,)
    assert rec.remake == "nox -s verify_sm120 -- --stack s"
