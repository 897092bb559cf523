"""The layer harness's verdict on what the ranks report (gpu.sglang_layer.expected_problems).

Each upstream layout says its one fallback warning in its own words (its adapter's):
communicator (0.5.10) in S4's, layer_boundary (0.5.23) in upstream's.  A wording of the
other layout, two lines, or two warnings fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from sm120fork.gpu.sglang_layer import expected_problems, warning_says

S4_WORDS = ("FlashInfer all-reduce fusion is off for this process: workspace creation "
            "failed on a rank; every rank takes the unfused path")
UPSTREAM_WORDS = ("Failed to initialize FlashInfer workspace (backend=trtllm): "
                 "CUDA_ERROR_OUT_OF_MEMORY: out of memory. Disabling flashinfer "
                 "allreduce fusion permanently.")


def _rank(rank: int, layout: str, warnings: list[str], *, correct: bool = True,
          path: str = "fallback/unfused") -> dict[str, Any]:
    return {"rank": rank, "layout": layout, "warnings": warnings, "gate_after": False,
            "unavailable": True,
            "steps": [{"tokens": t, "path": path, "correct": correct} for t in (1, 16)]}


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
                        f"{warning_says(layout)!r}: {words!r}"]


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
    def ranks(alive: int) -> list[dict[str, Any]]:
        return [{**_rank(r, "layer_boundary", [UPSTREAM_WORDS]), "fake_buffers_alive": alive}
                for r in (0, 1)]

    assert expected_problems("fused-call-raises", ranks(3)) == []
    assert expected_problems("fused-call-raises", ranks(0)) == [
        f"rank {r}: the workspace was freed after the fused call failed, while captured "
        "CUDA graphs may still use it" for r in (0, 1)]
    assert expected_problems("one-rank-create-fails", ranks(3)) == [
        f"rank {r}: 3 workspace buffers not freed" for r in (0, 1)]
