from __future__ import annotations

from typing import Any

from sm120fork.verify_sm120 import NAMES_SHOWN, compact


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
