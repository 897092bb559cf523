"""Issue 33 item 3 on two CPU ranks: SGLang 0.5.23's own layer path with a version 2
policy in force (``gpu.sglang_layer`` policy cases, CPU mode: a FlashInfer stand-in for the
fused kernel and for FlashInfer's pcie_ipc workspace behind SGLang's own pcie_ipc
communicator and dispatch).

Stock 0.5.23 (its SM12x gates opened in memory) ignores the policy: it fuses on both sides
of every boundary, and the harness says so at the boundary tokens.  The patched wheel and
stock + the plugin follow the policy once G7 reads version 2 (the series' G7 vendors
sm120fork's decision as ``layers/sm120fork_allreduce.py``); until then those cases are
expected to fail (strict: they must start passing when G7 lands).
Network (the sglang 0.5.23 wheel, via helpers_sglang's fixture), ~4 min on 2 cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sm120fork.gpu.layer import run as layer_run
from sm120fork.gpu.layer.rank import POLICY_CASES
from sm120fork.layouts import CaseOutcome

from helpers_sglang import SERIES, Sites

pytestmark = [pytest.mark.network, pytest.mark.slow]

#: The series' G7 reads policy version 2 (it vendors the decision module).
G7_READS_V2 = any("sm120fork_allreduce.py" in p.read_text(encoding="utf-8")
                  for p in SERIES.glob("0007-*.patch"))


def _run(runs: dict[str, tuple[Path, list[Path], str, bool]], python: str,
         ) -> dict[str, CaseOutcome]:
    """label -> (site, extra path, case, plugins); "stock" opens the gates in memory."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {label: pool.submit(
            layer_run.run_case, case, sglang_path=site, device="cpu", python=python,
            timeout=90,
            start_timeout=240, extra_path=extra, load_plugins=plugins,
            gates_in_memory=label.startswith("stock"), layout="layer_boundary",
            variant="plugin" if plugins else "patched")
            for label, (site, extra, case, plugins) in runs.items()}
        return {label: future.result() for label, future in futures.items()}


def test_stock_ignores_the_policy_and_the_harness_names_the_boundaries(sites: Sites) -> None:
    outcome = _run({"stock": (sites.stock, [sites.deps], "policy-eager", False)},
                   sites.python)["stock"]
    assert not outcome.hung
    assert not outcome.passed
    wrong = {p.split(" tokens")[0].split("at ")[-1] for p in outcome.problems}
    assert wrong == {"9", "32", "33", "64", "129"}, outcome.problems
    assert all("the route 'fused' ran" in p for p in outcome.problems)


@pytest.mark.xfail(not G7_READS_V2, strict=True,
                   reason="G7 reads policy version 1 until it follows version 2")
def test_the_patched_wheel_and_the_plugin_follow_the_policy(sites: Sites) -> None:
    outcomes = _run({
        f"{route} {case}": (site, extra, case, route == "plugin")
        for route, site, extra in (("patched", sites.patched, [sites.deps]),
                                   ("plugin", sites.stock, [sites.deps, sites.plugin]))
        for case in POLICY_CASES}, sites.python)
    failed = {label: o.problems for label, o in outcomes.items() if not o.passed}
    assert failed == {}
    for outcome in outcomes.values():
        routes = {s.route for r in outcome.ranks for s in r.steps}
        assert routes == {"fused", "pcie_ipc", "sglang_dispatch"}
