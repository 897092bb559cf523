"""Issue 19 item 1: one rank failing FlashInfer's workspace creation (sglang 0.5.23).

SGLang's own layer path on two CPU ranks over gloo (``gpu.sglang_layer``, CPU mode: a
FlashInfer stand-in whose creation makes the trtllm backend's collectives on SGLang's
device group and whose fused call reduces over it).  Stock 0.5.23 hangs when one rank
fails (bounded here by the case timeout); with G6, in the patched wheel and through the
plugin on stock, every rank falls back together with one warning and correct output.
Network (the sglang 0.5.23 wheel, via helpers_sglang's fixture), ~5 min on 2 cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sm120fork.gpu import sglang_layer

from helpers_sglang import Sites

pytestmark = [pytest.mark.network, pytest.mark.slow]

ONE_RANK = ("one-rank-create-fails", "one-rank-fails-midway", "one-rank-fails-late")


def _run(cases: tuple[str, ...], site: Path, extra: list[Path], *,
         gates_in_memory: bool = False, load_plugins: bool = False,
         ) -> dict[str, sglang_layer.CaseOutcome]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case: pool.submit(
            sglang_layer.run_case, case, sglang_path=site, device="cpu", tokens=(3, 16),
            timeout=30, start_timeout=240, extra_path=extra, gates_in_memory=gates_in_memory,
            load_plugins=load_plugins, layout="layer_boundary") for case in cases}
        return {case: future.result() for case, future in futures.items()}


def test_stock_hangs_when_one_rank_fails_creation(sites: Sites) -> None:
    """The reproducer: upstream's ranks wait in different collectives (bounded: 30 s)."""
    outcome = _run(("one-rank-create-fails",), sites.stock, [sites.deps],
                   gates_in_memory=True)["one-rank-create-fails"]
    assert outcome.hung, outcome.problems


def test_one_rank_failing_creation_fails_closed_on_every_rank(sites: Sites) -> None:
    outcomes = _run((*ONE_RANK, "fused-call-raises", "all-ranks-create-fails", "fused"),
                    sites.patched, [sites.deps])
    failed = {case: o.problems for case, o in outcomes.items() if not o.passed}
    assert failed == {}
    for case in ONE_RANK:
        for rank in outcomes[case].ranks:
            (warning,) = rank["warnings"]
            assert "on the whole group): rank 1: RuntimeError" in warning, warning


def test_the_plugin_on_stock_fails_closed_too(sites: Sites) -> None:
    outcomes = _run(("one-rank-create-fails", "fused-call-raises", "fused"), sites.stock,
                    [sites.deps, sites.plugin], load_plugins=True)
    failed = {case: o.problems for case, o in outcomes.items() if not o.passed}
    assert failed == {}
    lines = outcomes["fused"].ranks[0]["plugin"]
    assert lines
    assert all(line.endswith(": applied") for line in lines), lines
