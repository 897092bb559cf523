"""The layer harness's verdict on what the ranks report (gpu.layer.run.expected_problems).

Each upstream layout says its one fallback warning in its own words (its adapter's):
communicator (0.5.10) in S4's, layer_boundary (0.5.23) in upstream's.  A wording of the
other layout, two lines, or two warnings fail.  A fused call that raised on one rank only
is judged by how the ranks ended (``alone_problems``).
"""

from __future__ import annotations

import dataclasses

import pytest

from sm120fork.gpu.layer.run import (
    ALONE_SLACK_S,
    alone_problems,
    expected_problems,
    render,
)
from sm120fork.layouts import CaseOutcome, Ended, Observation, Raised, Step, adapter

S4_WORDS = ("FlashInfer all-reduce fusion is off for this process: workspace creation "
            "failed on a rank; every rank takes the unfused path")
UPSTREAM_WORDS = ("Failed to initialize FlashInfer workspace (backend=trtllm): "
                 "CUDA_ERROR_OUT_OF_MEMORY: out of memory. Disabling flashinfer "
                 "allreduce fusion permanently.")


def _rank(rank: int, layout: str, warnings: list[str], *, correct: bool = True,
          path: str = "fallback/unfused") -> Observation:
    return Observation(rank=rank, layout=layout, warnings=tuple(warnings), gate_after=False,
                       unavailable=True,
                       steps=tuple(Step(tokens=t, path=path, correct=correct, norm_error=0.0,
                                        residual_error=0.0) for t in (1, 16)))


@pytest.mark.parametrize(("layout", "words"), [("communicator", S4_WORDS),
                                                ("layer_boundary", UPSTREAM_WORDS)])
def test_each_layout_passes_with_its_own_one_line_warning(layout: str, words: str) -> None:
    ranks = [_rank(r, layout, [words]) for r in (0, 1)]
    assert expected_problems("all-ranks-create-fails", ranks) == []


@pytest.mark.parametrize(("layout", "words"), [("communicator", UPSTREAM_WORDS),
                                                ("layer_boundary", S4_WORDS)])
def test_the_other_layouts_wording_fails(layout: str, words: str) -> None:
    problems = expected_problems("all-ranks-create-fails", [_rank(0, layout, [words])])
    assert problems == [f"rank 0: the warning is not one line saying "
                        f"{adapter(layout).WARNING_SAYS!r}: {words!r}"]


def test_two_lines_or_two_warnings_or_a_wrong_output_fail() -> None:
    two_lines = expected_problems("one-rank-create-fails",
                                  [_rank(0, "layer_boundary", [UPSTREAM_WORDS + "\nmore"])])
    assert len(two_lines) == 1
    assert "not one line" in two_lines[0]
    two = expected_problems("one-rank-create-fails",
                            [_rank(0, "layer_boundary", [UPSTREAM_WORDS, UPSTREAM_WORDS])])
    assert two == ["rank 0: expected exactly one warning, got 2"]
    wrong = expected_problems("all-ranks-create-fails",
                              [_rank(1, "communicator", [S4_WORDS], correct=False)])
    assert wrong == ["rank 1: output differs from the reference at tokens [1, 16]"]


def test_a_fused_path_after_a_failure_fails() -> None:
    problems = expected_problems("all-ranks-create-fails",
                                 [_rank(0, "layer_boundary", [UPSTREAM_WORDS], path="fused")])
    assert problems == ["rank 0: took the fused path although fusion failed"]


def test_a_failed_fused_call_keeps_the_workspace_for_captured_graphs() -> None:
    def ranks(alive: int) -> list[Observation]:
        return [dataclasses.replace(_rank(r, "layer_boundary", [UPSTREAM_WORDS]),
                                    fake_buffers_alive=alive) for r in (0, 1)]

    assert expected_problems("fused-call-raises", ranks(3)) == []
    assert expected_problems("fused-call-raises", ranks(0)) == [
        f"rank {r}: the workspace was freed after the fused call failed, while captured "
        "CUDA graphs may still use it" for r in (0, 1)]
    assert expected_problems("one-rank-create-fails", ranks(3)) == [
        f"rank {r}: 3 workspace buffers not freed" for r in (0, 1)]


ALONE_WORDS = ("RuntimeError: FlashInfer fused all-reduce failed on this rank (ValueError: "
               "injected) and its peers did not fail with it within 3 s (...); they wait "
               "inside the fused kernel, so this process cannot fall back alone")


def _ended(rank: int, error: str | None, *, took: float | None = None, bound: float | None = 3.0,
           exit: int = 1, stopped: bool = False) -> Ended:
    raised = None if error is None else Raised(
        rank=rank, error=error, after_fused_call_error_s=took, agreement_timeout_s=bound)
    return Ended(rank=rank, exit=exit, stopped_by_harness=stopped,
                 ended_after_ready_s=None if stopped else 4.0, raised=raised)


@pytest.mark.parametrize("layout", ["communicator", "layer_boundary"])
def test_a_rank_raising_alone_passes_with_one_runtime_error_within_its_bound(
        layout: str) -> None:
    assert adapter(layout).RAISED_ALONE_SAYS in ALONE_WORDS
    peer_raised = [_ended(0, "RuntimeError: Connection closed by peer"),
                   _ended(1, ALONE_WORDS, took=3.1)]
    assert alone_problems("one-rank-fused-call-raises", peer_raised, layout=layout) == []
    peer_stopped = [_ended(0, None, exit=-9, stopped=True), _ended(1, ALONE_WORDS, took=3.1)]
    assert alone_problems("one-rank-fused-call-raises", peer_stopped, layout=layout) == []
    assert alone_problems("rank-0-fused-call-raises",
                          [_ended(0, ALONE_WORDS, took=3.0), _ended(1, None, stopped=True)],
                          layout=layout) == []


def test_a_rank_raising_alone_past_its_bound_or_in_other_words_fails() -> None:
    case, peer = "one-rank-fused-call-raises", _ended(0, None, exit=-9, stopped=True)
    late = alone_problems(case, [peer, _ended(1, ALONE_WORDS, took=3 + ALONE_SLACK_S + 0.5)],
                          layout="communicator")
    assert late == [f"rank 1: its error came {3 + ALONE_SLACK_S + 0.5} s after the fused "
                    "call raised, beyond its 3 s agreement timeout"]
    raw = alone_problems(case, [peer, _ended(1, "ValueError: injected", took=0.0, bound=None)],
                         layout="layer_boundary")
    assert raw == ["rank 1: expected one RuntimeError saying 'peers did not fail with it', "
                   "got 'ValueError: injected'",
                   "rank 1: the tree under test has no agreement timeout "
                   "(_FUSED_CALL_AGREEMENT_TIMEOUT_S in its fusion module)"]
    killed = alone_problems(case, [peer, _ended(1, None, exit=-9, stopped=True)],
                            layout="communicator")
    assert killed == ["rank 1: its fused call raised alone, but it ended without an error "
                      "(exit -9, stopped by the harness: True)"]


def test_a_rank_that_finishes_the_case_after_a_lone_fused_error_fails() -> None:
    finished = [_ended(0, None, exit=0), _ended(1, None, exit=0)]
    assert alone_problems("one-rank-fused-call-raises", finished, layout="communicator") == [
        f"rank {r}: finished the case although the fused call raised on rank 1 only"
        for r in (0, 1)]


def test_the_report_says_how_each_rank_of_a_lone_fused_error_ended() -> None:
    exits = [_ended(0, "RuntimeError: Connection closed by peer"),
             _ended(1, ALONE_WORDS, took=3.1)]
    outcome = CaseOutcome(case="one-rank-fused-call-raises", passed=True, hung=False,
                          problems=[], ranks=[], seconds=9.0, tails=[], exits=exits)
    rows = [line for line in render([outcome], title="t", notes=[]).splitlines()
            if line.startswith("| one-rank-fused-call-raises")]
    assert rows[0].startswith("| one-rank-fused-call-raises | PASS | 0 | - | ended: exit 1 "
                              "at 4.0 s | - | RuntimeError: Connection closed by peer |")
    assert "| 1 | fused-call-raises | ended: exit 1 at 4.0 s, 3.1 s after its fused call " \
        "raised | - | RuntimeError: FlashInfer fused" in rows[1]
