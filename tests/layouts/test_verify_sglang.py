"""Behaviour checks of the SGLang series against the real patched and unpatched modules.

The slow tests fetch the sglang 0.5.10.post1 sdist through the toolkit (network) and need
an interpreter with the sglang-probe dependency group installed
(SM120FORK_VERIFY_PYTHON, default: this one; `nox -s tests` installs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sm120fork.errors import VerifyError
from sm120fork.gpu.layer.run import run_case
from sm120fork.layouts.communicator import (
    SM12X,
    TOGETHER_CASES,
    UNCHANGED,
    check,
)
from sm120fork.layouts.results import CheckResult

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def sglang_trees(sglang_0510: Path, sglang_0510_upstream: Path) -> tuple[Path, Path]:
    """(patched, upstream) fork trees made by the toolkit's own pipeline, shared by the
    run (helpers_sglang), read only."""
    return sglang_0510, sglang_0510_upstream


@pytest.fixture(scope="module")
def results(sglang_trees: tuple[Path, Path], zygote_python: str) -> list[CheckResult]:
    patched, upstream = sglang_trees
    return check(patched, baseline=upstream, layer=run_case, python=zygote_python)


def _named(results: list[CheckResult], prefix: str, cap: str) -> dict[str, CheckResult]:
    return {r.name.removeprefix(prefix).strip(): r for r in results
            if r.name.startswith(prefix) and r.capability == cap}


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("cap", SM12X)
def test_explicit_flag_fuses_on_sm12x_at_every_tp(results: list[CheckResult], cap: str) -> None:
    explicit = _named(results, "S1", cap)
    assert sorted(explicit) == ["explicit-flag tp2", "explicit-flag tp4", "explicit-flag tp8"]
    for result in explicit.values():
        assert result.passed, result
        assert result.observed == '{"flag":true,"fused":true,"sm12x_lines":1}'


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("cap", SM12X)
def test_auto_enable_on_sm12x_only_at_tp2_unless_overridden(
        results: list[CheckResult], cap: str) -> None:
    auto = _named(results, "S2", cap)
    assert all(r.passed for r in auto.values()), [r for r in auto.values() if not r.passed]
    fused = {name: '"fused":true' in r.observed for name, r in auto.items()}
    assert {f"auto tp{tp}" for tp in (1, 2, 4, 8) if fused[f"auto tp{tp}"]} == {"auto tp2"}
    env = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
    assert fused[f"auto tp8 {env}=1"]
    assert fused[f"auto tp4 {env}=on"]
    assert not fused[f"auto tp2 {env}=0"]
    assert not fused[f"auto tp2 {env}=off"]
    assert auto[f"auto tp2 {env}=maybe"].observed == '"error"'
    assert "is not a valid value" in auto[f"auto tp2 {env}=maybe"].detail
    assert "TP4 regressed upstream" in auto["auto tp4"].detail
    assert not fused["enforce-disable auto tp2"]


@pytest.mark.slow
@pytest.mark.network
def test_nothing_changes_for_sm80_sm90_sm100(results: list[CheckResult]) -> None:
    unchanged = [r for r in results if r.name.startswith("unchanged")]
    assert {r.capability for r in unchanged} == set(UNCHANGED)
    decisions = [r for r in results if r.capability == "12.0" and r.name[:2] in ("S1", "S2")]
    assert len(unchanged) == 3 * len(decisions)
    assert all(r.passed for r in unchanged), [r for r in unchanged if not r.passed]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("cap", SM12X)
def test_the_sm12x_decision_is_logged_in_one_line(results: list[CheckResult], cap: str) -> None:
    decisions = {**_named(results, "S1", cap), **_named(results, "S2", cap)}
    for name, result in decisions.items():
        if result.observed != '"error"':
            assert '"sm12x_lines":1' in result.observed, (name, result)
    assert "Auto-enabling FlashInfer AllReduce Fusion on SM12x" in decisions["auto tp2"].detail
    assert "TP2 measured faster upstream" in decisions["auto tp2"].detail
    assert "FlashInfer AllReduce Fusion on SM12x (TP4" in decisions["auto tp4"].detail
    assert "explicitly enabled, at any TP size" in decisions["explicit-flag tp8"].detail


@pytest.mark.slow
@pytest.mark.network
def test_below_cuda_12_9_fusion_stays_off_and_says_why(results: list[CheckResult]) -> None:
    old = {r.name: r for r in results if r.capability == "12.0 CUDA 12.8"}
    assert len(old) == len(_named(results, "S1", "12.0")) + len(_named(results, "S2", "12.0"))
    assert all(r.passed for r in old.values()), [r for r in old.values() if not r.passed]
    for name in ("S1 explicit-flag tp2", "S2 auto tp2"):
        assert old[name].observed == '{"flag":false,"fused":false,"sm12x_lines":1}'
        assert "FlashInfer needs CUDA >= 12.9 to build for SM12x" in old[name].detail
        assert "CUDA 12.8" in old[name].detail
    assert "explicitly enabled but off" in old["S1 explicit-flag tp4"].detail


@pytest.mark.slow
@pytest.mark.network
def test_unfused_fallback_all_reduces_over_the_attention_group(
        results: list[CheckResult]) -> None:
    (fallback,) = [r for r in results if r.name.startswith("S3")]
    assert fallback.passed, fallback
    assert "attention TP group called with [(3, 64)], over the TP group with []" in (
        fallback.detail)


@pytest.mark.slow
@pytest.mark.network
def test_two_ranks_fail_closed_together(results: list[CheckResult]) -> None:
    together = {r.name.removeprefix("S4 two ranks: "): r for r in results
                if r.name.startswith("S4 two ranks")}
    assert set(together) == set(TOGETHER_CASES)
    assert all(r.passed for r in together.values()), [
        r for r in together.values() if not r.passed]
    assert '"paths":["fused"]' in together["fused"].observed
    # One rank failing alone, at any point of the collective creation: both ranks fall
    # back, both outputs match the reference, one warning each, nobody hangs.
    for case in ("one-rank-create-fails", "one-rank-fails-midway", "one-rank-fails-late"):
        assert "could not be created on 1 of 2 ranks" in together[case].detail, case
        assert "rank 1:" in together[case].detail
    assert "GPU 0" in together["no-p2p"].detail
    assert "GPU 1" in together["no-p2p"].detail
    assert "the fused all-reduce call raised" in together["fused-call-raises"].detail
    assert "workspace stays allocated" in together["fused-call-raises"].detail  # graphs
    # FlashInfer 0.6.7's POSIX-fd exchange: the peer's blocked receive times out (S4's
    # bound, 3 s here) and becomes its reported failure, so both ranks fall back instead
    # of hanging.
    assert "TimeoutError" in together["one-rank-fails-in-fd-exchange"].detail


@pytest.mark.slow
@pytest.mark.network
def test_unpatched_upstream_fails_the_sm12x_checks(sglang_trees: tuple[Path, Path],
                                                  zygote_python: str) -> None:
    _, upstream = sglang_trees
    results = check(upstream, baseline=None, layer=run_case, python=zygote_python)
    failed = {r.name.split()[0] for r in results if not r.passed}
    assert failed == {"S1", "S2", "S3", "S4"}
    # Without a baseline, 8.0/9.0/10.0 are judged by the known upstream decisions.
    assert all(r.passed for r in results if r.name.startswith("unchanged"))


def test_a_probe_that_cannot_run_is_a_verify_error(tmp_path: Path) -> None:
    (tmp_path / "python" / "sglang").mkdir(parents=True)  # a package without srt/
    (tmp_path / "python" / "sglang" / "__init__.py").touch()
    with pytest.raises(VerifyError, match="probe") as info:
        check(tmp_path, baseline=None, layer=run_case, python=sys.executable, jobs=1)
    # The tree lacks the module, not this Python a requirement (issue 41: no guessed hint).
    assert "the tree under test has no module 'sglang.srt" in info.value.what
    assert "--group sglang-probe" not in str(info.value)


def test_a_tree_without_python_dir_is_a_verify_error(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="python/sglang"):
        check(tmp_path / "patched", baseline=tmp_path, layer=run_case, python=sys.executable)
