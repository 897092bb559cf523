"""The layer harness's verdict on what the ranks report (gpu.sglang_layer.expected_problems).

Each SGLang flavour says its one fallback warning in its own words: 0.5.10's S4 in ours,
0.5.23 in upstream's.  A wording of the other flavour, two lines, or two warnings fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from sm120fork.gpu.sglang_layer import WARNING_SAYS, expected_problems

S4_WORDS = ("FlashInfer all-reduce fusion is off for this process: workspace creation "
            "failed on a rank; every rank takes the unfused path")
UPSTREAM_0523 = ("Failed to initialize FlashInfer workspace (backend=trtllm): "
                 "CUDA_ERROR_OUT_OF_MEMORY: out of memory. Disabling flashinfer "
                 "allreduce fusion permanently.")


def _rank(rank: int, flavour: str, warnings: list[str], *, correct: bool = True,
          path: str = "fallback/unfused") -> dict[str, Any]:
    return {"rank": rank, "flavour": flavour, "warnings": warnings, "gate_after": False,
            "unavailable": True,
            "steps": [{"tokens": t, "path": path, "correct": correct} for t in (1, 16)]}


@pytest.mark.parametrize(("flavour", "words"), [("0.5.10", S4_WORDS),
                                                ("0.5.23", UPSTREAM_0523)])
def test_each_flavour_passes_with_its_own_one_line_warning(flavour: str, words: str) -> None:
    ranks = [_rank(r, flavour, [words]) for r in (0, 1)]
    assert expected_problems("all-ranks-create-fails", ranks) == []


@pytest.mark.parametrize(("flavour", "words"), [("0.5.10", UPSTREAM_0523),
                                                ("0.5.23", S4_WORDS)])
def test_the_other_flavours_wording_fails(flavour: str, words: str) -> None:
    problems = expected_problems("all-ranks-create-fails", [_rank(0, flavour, [words])])
    assert problems == [f"rank 0: the warning is not one line saying "
                        f"{WARNING_SAYS[flavour]!r}: {words!r}"]


def test_two_lines_or_two_warnings_or_a_wrong_output_fail() -> None:
    two_lines = expected_problems("one-rank-create-fails",
                                  [_rank(0, "0.5.23", [UPSTREAM_0523 + "\nmore"])])
    assert len(two_lines) == 1
    assert "not one line" in two_lines[0]
    two = expected_problems("one-rank-create-fails",
                            [_rank(0, "0.5.23", [UPSTREAM_0523, UPSTREAM_0523])])
    assert two == ["rank 0: expected exactly one warning, got 2"]
    wrong = expected_problems("all-ranks-create-fails",
                              [_rank(1, "0.5.10", [S4_WORDS], correct=False)])
    assert wrong == ["rank 1: output differs from the reference at tokens [1, 16]"]


def test_a_fused_path_after_a_failure_fails() -> None:
    problems = expected_problems("all-ranks-create-fails",
                                 [_rank(0, "0.5.23", [UPSTREAM_0523], path="fused")])
    assert problems == ["rank 0: took the fused path although fusion failed"]
