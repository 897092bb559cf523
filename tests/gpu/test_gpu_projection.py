"""The 8x RTX PRO 6000 projection (issue 22 item 5): marked as such, and current."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120fork.gpu.bench import projection

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "reports" / "projection" / "8x-rtxpro6000"


def test_the_committed_projection_is_what_the_function_writes(tmp_path: Path) -> None:
    written = projection.write(projection.table(), tmp_path)
    for path in written:
        assert (COMMITTED / path.name).read_text() == path.read_text(), path.name


def test_it_says_it_is_a_projection_everywhere() -> None:
    doc = projection.table()
    assert doc.label.startswith("PROJECTION")
    assert f"**{projection.LABEL}.**" in projection.render(doc)


def test_the_model_follows_the_facts() -> None:
    small, large = projection.project(8, 1, 7168), projection.project(8, 512, 7168)
    assert "fused_twoshot" not in small  # FlashInfer refuses two-shot at tokens <= ranks
    # published pcie_ipc TP8: 5.3 us at 12 KiB, plus a norm kernel of 2-3 us
    assert projection.project(8, 1, 6144)["pcie_ipc_rmsnorm"] == pytest.approx((7.3, 8.3))
    for method, (lo, hi) in large.items():
        assert lo <= hi
        assert method not in small or small[method][1] <= hi
    # a one-shot pushes (w-1) x the message: at 7 MiB it loses to a two-shot
    assert large["fused_oneshot"][0] > large["fused_twoshot"][1]
