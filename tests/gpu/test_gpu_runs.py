"""``gpu test`` end to end on CPU: fake module build, fake rank processes, the real runs.

What a user relies on: a run whose cases did not run never reads as a pass, and the
module build's minutes do not eat the cases' time budget (issue 22 item 4).
"""

from __future__ import annotations

import functools
import json
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sm120fork.gpu.ab import run as runs
from sm120fork.gpu.ab.results import AbRun, CaseResult
from sm120fork.gpu.cli import main
from sm120fork.gpu.core import variants

FAKE_RANK = textwrap.dedent("""\
    import json, os, sys, time
    from sm120fork.util.wire import encode
    from sm120fork.gpu.core.cases import Case
    spec = json.load(open(sys.argv[1])); rank = int(sys.argv[2])
    mode = os.environ["FAKE_RANK_MODE"]
    for c in spec["cases"]:
        key = Case(**c).key
        print(encode("START", key), flush=True)
        if mode == "hang":
            time.sleep(600)
        status = "skip" if mode == "skip" else "pass"
        print(encode("RESULT", {"key": key, "rank": rank, "status": status,
              "reason": "needs sm_100+" if status == "skip" else None, "checks": []}),
              flush=True)
    print(encode("DONE"), flush=True)
""")


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_here: None) -> Path:
    """Module build that takes 3 s and succeeds; ranks are the fake script above."""
    script = tmp_path / "fake_rank.py"
    script.write_text(FAKE_RANK)

    def compile_variants(installed: Sequence[variants.Variant], _run_dir: Path, **_: Any
                         ) -> dict[str, variants.ModuleBuild]:
        time.sleep(3.0)
        return {v.name: variants.ModuleBuild(ok=True, env={"gpu_count": 1, "gpus": ["Fake GPU"]})
                for v in installed}

    monkeypatch.setattr(variants, "compile_variants", compile_variants)
    monkeypatch.setattr(runs, "run_cases", functools.partial(
        runs.run_cases, worker=(sys.executable, str(script))))
    return tmp_path


def _test(tmp: Path, *extra: str) -> list[str]:
    return ["test", "--quick", "--world-sizes", "2", "--api", "fusion_legacy",
            "--max-cases", "3", "--work-dir", str(tmp / "work"), "--out", str(tmp / "out"),
            "--startup-timeout", "60", *extra]


def _budgeted(tmp: Path, budget: float, **extra: Any) -> runs.TestOptions:
    """What ``tune`` passes (the command line has no time budget: per-case limits only)."""
    return runs.TestOptions(command="x", quick=True, world_sizes=(2,),
                            apis=("fusion_legacy",), max_cases=3, work_dir=tmp / "work",
                            out=tmp / "out", startup_timeout=60, time_budget=budget, **extra)


def test_the_time_budget_starts_after_the_module_build(
        fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_RANK_MODE", "pass")
    done = runs.run_test(_budgeted(fake_gpu, 2))
    assert done.error() is None
    doc = json.loads((fake_gpu / "out" / "test-ab.json").read_text())
    assert [r["status"] for r in doc["results"]["installed"]] == ["pass"] * 3
    assert doc["finished"] is True
    assert doc["module_seconds"] >= 3
    out = "\n".join(done.headline())
    assert "installed: 0 failing, 3 passing, 0 skipped of 3" in out
    assert "module build 3 s; cases' time budget 2 s, counted after it" in out


def test_the_command_line_has_no_time_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """Per-case limits and the module build's own limit; no budget "for leased machines"."""
    assert main(["test", "--quick", "--time-budget", "2"]) == 16
    assert "unrecognized arguments: --time-budget" in capsys.readouterr().err


def test_cases_left_out_by_the_budget_make_the_run_fail_unless_partial_is_allowed(
        fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_RANK_MODE", "hang")
    done = runs.run_test(_budgeted(fake_gpu, 2, case_timeout=120))
    out = "\n".join(done.headline())
    assert "3 NEVER RAN" in out
    assert "NOTHING RAN" in out
    assert "UNFINISHED" in out
    error = done.error()
    assert error is not None
    assert "did not run" in error.message or "no case ran" in error.message
    doc = json.loads((fake_gpu / "out" / "test-ab.json").read_text())
    assert doc["finished"] is False
    assert "**Not finished**: 3 planned case runs did not run" in (
        fake_gpu / "out" / "test-ab.md").read_text()


def test_allow_partial_accepts_a_partial_run_but_says_so() -> None:
    recs = (*(CaseResult(key=f"p{i}", status="pass") for i in range(5)),
            *(CaseResult(key=f"n{i}", status="skip", not_run=True) for i in range(4)))
    done = runs.TestRun(
        paths=[Path("a.json"), Path("a.md")], logs=Path("logs"),
        doc=AbRun(primary="patched", baseline="unpatched", time_budget=150.0,
                  results={"patched": recs, "unpatched": recs}),
        module_seconds=178.0, allow_partial=True)
    assert done.error() is None
    assert done.headline()[-1] == "UNFINISHED: not every planned case ran (accepted)"
    strict = runs.TestRun(**{**done.__dict__, "allow_partial": False})
    error = strict.error()
    assert error is not None
    assert "8 planned cases did not run" in error.message


def test_cases_whose_module_did_not_build_never_ran_the_run_is_unfinished() -> None:
    """Not "0 failing": a variant whose module did not build ran none of its cases."""
    recs = tuple(CaseResult(key=k, status="fail", failure="build", reason="JIT build failed")
                 for k in "abc")
    tally = runs.Tally.of(recs)
    assert (tally.failed, tally.not_run, tally.ran) == (0, 3, 0)
    done = runs.TestRun(paths=[Path("a.json"), Path("a.md")], logs=Path("logs"),
                        doc=AbRun(primary="patched", results={"patched": recs}),
                        module_seconds=1.0)
    error = done.error()
    assert error is not None
    assert error.message.startswith("unfinished: 3 planned case runs never ran")


def test_a_run_whose_cases_were_all_skipped_is_a_failure(
        fake_gpu: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAKE_RANK_MODE", "skip")
    assert main(_test(fake_gpu)) == 13
    captured = capsys.readouterr()
    assert "installed: 0 failing, 0 passing, 3 skipped of 3; NOTHING RAN" in captured.out
    assert "no case ran" in captured.err


def test_without_world_sizes_a_one_gpu_box_runs_world_size_2_only(
        fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`nox -s gpu_test -- --stack S --quick` on a one-GPU box: two ranks share it; four or
    eight ranks on one GPU would only cost time."""
    monkeypatch.setenv("FAKE_RANK_MODE", "pass")
    done = runs.run_test(runs.TestOptions(
        command="x", quick=True, apis=("fusion_legacy",), max_cases=2,
        work_dir=fake_gpu / "work", out=fake_gpu / "out", startup_timeout=60))
    assert done.error() is None
    doc = json.loads((fake_gpu / "out" / "test-ab.json").read_text())
    assert doc["world_sizes"] == [2]
    assert {r["case"]["world_size"] for r in doc["results"]["installed"]} == {2}


def test_the_default_world_sizes_follow_the_gpu_count() -> None:
    assert runs.default_test_world_sizes(1) == (2,)
    assert runs.default_test_world_sizes(2) == (2,)
    assert runs.default_test_world_sizes(4) == (2, 4)
    assert runs.default_test_world_sizes(8) == (2, 4, 8)
