"""The one decision SGLang's side calls: per token range, the method this process runs."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest

from sm120fork.errors import ConfigError
from sm120fork.gpu import decision, methods, policy
from sm120fork.gpu.decision import Process

EVERY = frozenset(decision.needed_names())


def _doc(ranges: list[dict[str, Any]], *, tp: int = 4, for_use: bool = True
         ) -> dict[str, Any]:
    return policy.validate({"format": policy.FORMAT, "version": 2, "for_use": for_use,
                            "made": {}, "tp": {str(tp): {"ranges": ranges}}}, "p.json")


def _rng(lo: int, hi: int, method: str, *fallback: str) -> dict[str, Any]:
    return {"min_tokens": lo, "max_tokens": hi, "method": method, "fallback": list(fallback)}


MEASURED = [_rng(1, 16, "b12x_fused", "fused_auto", "pcie_ipc_rmsnorm", "nccl_rmsnorm"),
            _rng(17, 512, "pcie_ipc_rmsnorm", "fused_auto", "nccl_rmsnorm")]


def _spans(d: decision.Decision) -> list[tuple[int, int | None, str]]:
    return [(r.min_tokens, r.max_tokens, r.method) for r in d.ranges]


def test_a_process_that_can_run_everything_follows_the_policy() -> None:
    d = decision.decide(_doc(MEASURED), Process(world_size=4, gpu_major=12, present=EVERY),
                        source="policy p.json")
    assert _spans(d) == [(1, 16, "b12x_fused"), (17, 512, "pcie_ipc_rmsnorm"),
                         (513, None, "nccl_rmsnorm")]
    assert d.fallbacks == ()
    assert (d.method_for(1), d.route_for(16), d.route_for(17), d.route_for(4096)) == (
        "b12x_fused", "b12x", "pcie_ipc", "sglang_dispatch")
    assert d.line == ("all-reduce at TP4: b12x_fused for 1-16, pcie_ipc_rmsnorm for 17-512, "
                      "nccl_rmsnorm for 513+ tokens (policy p.json)")


@pytest.mark.parametrize(("process", "first", "why"), [
    (Process(world_size=4, gpu_major=9, present=EVERY), "fused_auto",
     "it runs on SM12x only; this GPU is SM9x"),
    (Process(world_size=4, gpu_major=12, present=EVERY - {"flashinfer.experimental.b12x"}),
     "fused_auto", "flashinfer.experimental.b12x does not import here"),
    (Process(world_size=4, gpu_major=12, present=EVERY, dtype="fp16"), "fused_auto",
     "it runs bf16 only; this process all-reduces fp16"),
])
def test_a_method_the_process_cannot_run_falls_back_with_one_line(
        process: Process, first: str, why: str) -> None:
    d = decision.decide(_doc(MEASURED), process)
    assert d.ranges[0].method == first
    assert d.ranges[0].wanted == "b12x_fused"
    assert d.fallbacks[0] == (f"TP4 tokens 1-16: b12x_fused cannot run here ({why}); "
                              "falling back to fused_auto")


def test_each_method_skipped_is_one_line_and_the_last_resort_always_runs() -> None:
    """SM90 at TP6: b12x (SM12x), our fused path (turned off), pcie_ipc (TP 2/4/8)."""
    doc = _doc(MEASURED, tp=6)
    d = decision.decide(doc, Process(world_size=6, gpu_major=9, present=EVERY,
                                     fused_override=False))
    assert _spans(d) == [(1, 16, "nccl_rmsnorm"), (17, 512, "nccl_rmsnorm"),
                         (513, None, "nccl_rmsnorm")]
    assert [line.split(": ", 1)[1].split(" cannot")[0] for line in d.fallbacks] == [
        "b12x_fused", "fused_auto", "pcie_ipc_rmsnorm", "pcie_ipc_rmsnorm", "fused_auto"]
    assert "it runs at TP 2, 4, 8 only; this process is TP6" in d.fallbacks[2]


def test_a_range_longer_than_a_method_takes_falls_back() -> None:
    d = decision.decide(_doc([_rng(1, 64, "b12x_fused", "fused_auto")]),
                        Process(world_size=4, gpu_major=12, present=EVERY))
    assert d.ranges[0].method == "fused_auto"
    assert "it takes at most 36 tokens" in d.fallbacks[0]


def test_capture_and_unknown_methods_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(methods.SERVING, "pcie_ipc_rmsnorm", dataclasses.replace(
        methods.SERVING["pcie_ipc_rmsnorm"], in_graphs=False))
    doc = _doc([_rng(1, 8, "from_the_future", "pcie_ipc_rmsnorm", "fused_auto")])
    eager = decision.decide(doc, Process(world_size=4, present=EVERY))
    graph = decision.decide(doc, Process(world_size=4, present=EVERY, capturing=True))
    assert (eager.ranges[0].method, graph.ranges[0].method) == ("pcie_ipc_rmsnorm",
                                                                "fused_auto")
    assert "does not know the method" in eager.fallbacks[0]
    assert "cannot be captured into a CUDA graph" in graph.fallbacks[1]


def test_bench_only_variants_are_never_run() -> None:
    doc = _doc([_rng(1, 8, "fused_oneshot", "fused_auto")])
    d = decision.decide(doc, Process(world_size=4, present=EVERY))
    assert d.ranges[0].method == "fused_auto"
    assert "SGLang cannot select it" in d.fallbacks[0]


@pytest.mark.parametrize(("doc", "tp", "method", "source"), [
    (None, 2, "fused_auto", "today's rule: our fused path at TP2 only; no policy"),
    (None, 4, "nccl_rmsnorm", "today's rule: our fused path at TP2 only; no policy"),
    (_doc(MEASURED, for_use=False), 2, "fused_auto",
     "today's rule: our fused path at TP2 only; the policy is marked not for use"),
    (_doc(MEASURED), 8, "nccl_rmsnorm",
     "today's rule: our fused path at TP2 only; the policy has no entry for TP8"),
])
def test_without_a_usable_policy_todays_rule_holds(doc: dict[str, Any] | None, tp: int,
                                                   method: str, source: str) -> None:
    d = decision.decide(doc, Process(world_size=tp, present=EVERY))
    assert (d.by_policy, _spans(d), d.source) == (False, [(1, None, method)], source)


def test_the_override_decides_the_fused_path_without_a_policy() -> None:
    on = decision.decide(None, Process(world_size=8, present=EVERY, fused_override=True))
    off = decision.decide(None, Process(world_size=2, present=EVERY, fused_override=False))
    assert (on.ranges[0].method, off.ranges[0].method) == ("fused_auto", "nccl_rmsnorm")
    assert on.source.startswith(f"{policy.AUTO_ENV}=1")


def test_a_version_1_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="policy version 1: this reader takes versions 2"):
        policy.validate({"format": policy.FORMAT, "version": 1, "for_use": True,
                         "made": {}, "tp": {"2": {"fused_max_tokens": 64, "ranges": []}}},
                        "old.json")


def test_importable_reads_modules_and_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("fake_flashinfer_comm")
    fake.PcieIpcAllReduceWorkspace = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_flashinfer_comm", fake)
    assert decision.importable(["fake_flashinfer_comm:PcieIpcAllReduceWorkspace",
                                "fake_flashinfer_comm:trtllm_allreduce_fusion", "json",
                                "no_such_module_here.sub"]) == frozenset(
        {"fake_flashinfer_comm:PcieIpcAllReduceWorkspace", "json"})


def test_every_method_a_policy_can_name_has_a_route_sglang_knows() -> None:
    named = {n for n, s in methods.METHODS.items() if s.route is not None}
    assert named == {"fused_auto", "pcie_ipc_rmsnorm", "b12x_fused", "nccl_rmsnorm",
                     "custom_sglang_rmsnorm"}
    assert {methods.METHODS[n].route for n in named} == set(methods.ROUTES)
    assert methods.METHODS[methods.UNFUSED].route == "sglang_dispatch"
