"""The bench inside a rank (gpu/bench/timing.py ``measure``) on the CPU: torch.cuda's graphs
are fakes that record the ops captured and run them on replay, and a method writes the
fp32 reference of each point, so what is checked is the bench's own frame: each method is
checked eagerly and in a graph replay on every point's inputs, then timed; a replay that
writes nothing fails its check and is never timed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest
import torch

from sm120fork.gpu.bench import timing
from sm120fork.gpu.core import reference
from sm120fork.gpu.core.cases import BenchPlan
from sm120fork.util import wire


class _Graph:
    capturing: _Graph | None = None
    writes = True

    def __init__(self) -> None:
        self.ops: list[Callable[[], None]] = []

    def replay(self) -> None:
        for op in self.ops if _Graph.writes else ():
            op()


class _Rank:
    rank, world, shared = 0, 2, False
    device = torch.device("cpu")
    spec: ClassVar[dict[str, object]] = {"module_failures": {}}

    def barrier(self) -> None:
        pass


class _Reference(timing.Adapter):
    """Writes the point's fp32 reference (of every rank's inputs) into its outputs."""

    def __init__(self, rk: Any, name: str, refs: list[Any]) -> None:
        super().__init__(rk)
        self.name, self.refs = name, refs

    def op(self, i: int) -> Callable[[], None]:
        _x, _res, r_out, n_out = self.bufs[i]

        def run() -> None:
            ref = self.refs[-1]
            r_out.copy_(ref["residual"])
            n_out.copy_(ref["norm"])

        def maybe_captured() -> None:
            if _Graph.capturing is not None:
                _Graph.capturing.ops.append(run)
            else:
                run()
        return maybe_captured

    def outputs(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        _x, _res, r_out, n_out = self.bufs[i]
        return r_out, n_out


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
          ) -> Callable[[], list[dict[str, Any]]]:
    """``measure`` of one method on two points, run; the records rank 0 said."""
    @contextmanager
    def graph(g: _Graph, stream: object = None) -> Iterator[None]:
        _Graph.capturing = g
        yield
        _Graph.capturing = None

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", type("S", (), {
        "wait_stream": lambda self, other: None}))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    monkeypatch.setattr(torch.distributed, "all_gather_object",  # the peer says the same
                        lambda out, value: out.__setitem__(slice(None), [value] * len(out)))
    monkeypatch.setattr(timing, "_time_graph", lambda *_a, **_k: [2.0, 3.0, 4.0])
    refs: list[Any] = []  # each point's reference, as the bench computes it
    real_expected = reference.expected

    def track(data: Any) -> Any:
        refs.append(real_expected(data))
        return refs[-1]

    monkeypatch.setattr(timing, "expected", track)
    monkeypatch.setitem(timing.FACTORIES, "fused_auto",
                        lambda rk: _Reference(rk, "fused_auto", refs))

    def run() -> list[dict[str, Any]]:
        plan = BenchPlan(world_size=2, tokens=(1, 4), hidden=(64,), floors=False)
        timing.measure(_Rank(), plan, ["fused_auto"])  # type: ignore[arg-type]
        said = [wire.decode(line) for line in capsys.readouterr().out.splitlines()]
        return [m.data for m in said if m is not None and m.tag == "BENCH"]

    return run


def test_a_method_is_checked_eagerly_and_in_a_replay_then_timed_at_every_point(
        bench: Callable[[], list[dict[str, Any]]]) -> None:
    _Graph.writes = True
    points = [r for r in bench() if r["kind"] == "point"]
    assert [(r["tokens"], r["status"]) for r in points] == [(1, "timed"), (4, "timed")]
    assert all(r["median_us"] == 3.0 for r in points)


def test_a_replay_that_writes_nothing_fails_its_check_and_is_not_timed(
        bench: Callable[[], list[dict[str, Any]]]) -> None:
    _Graph.writes = False
    try:
        points = [r for r in bench() if r["kind"] == "point"]
    finally:
        _Graph.writes = True
    assert [r["status"] for r in points] == ["failed_check", "failed_check"]
    stages = [(c["stage"], c["output"], c["ok"]) for c in points[0]["checks"]]
    assert stages == [("eager", "residual", True), ("eager", "norm", True),
                      ("graph replay", "residual", False), ("graph replay", "norm", False)]
    assert "NaN/Inf" in points[0]["reason"]


def test_a_fused_adapter_calls_the_unified_api_else_the_legacy_one_with_its_strategy() -> None:
    """The adapters' FlashInfer calls, with FlashInfer a fake that records them."""
    calls: list[tuple[str, dict[str, Any]]] = []

    class _Fc:
        def allreduce_fusion(self, **kw: Any) -> None:
            calls.append(("unified", kw))

        def trtllm_allreduce_fusion(self, **kw: Any) -> None:
            calls.append(("legacy", kw))

    class _FusedRank(_Rank):
        fc = _Fc()
        unified = True

        def workspace(self, api: str) -> Any:
            if api == "fusion_unified" and not self.unified:
                raise RuntimeError("no unified workspace here")
            return {"tensor": "ptrs", "metadata": "meta"}

    bufs = [tuple(torch.zeros(4, 8) for _ in range(4))]
    for unified, name, oneshot in ((True, "fused_oneshot", True), (False, "fused_auto", None)):
        rk = _FusedRank()
        rk.unified = unified
        adapter = timing.FACTORIES[name](rk)  # type: ignore[arg-type]
        assert adapter.unavailable() is None
        adapter.bind(bufs, torch.ones(8), timing.Point(4, 8))  # type: ignore[arg-type]
        adapter.op(0)()
        api, kw = calls[-1]
        assert (api, kw["use_oneshot"], kw["launch_with_pdl"]) == (
            "unified" if unified else "legacy", oneshot, True)
        assert kw["norm_out"].numel() == 32
    assert calls[-1][1]["token_num"] == 4
    assert calls[-1][1]["workspace_ptrs"] == "ptrs"
    assert timing.FACTORIES["fused_twoshot"](_Rank()).unsupported(  # type: ignore[arg-type]
        timing.Point(2, 8)) is not None


def test_a_custom_all_reduce_whose_module_does_not_import_is_not_runnable() -> None:
    adapter = timing.FACTORIES["custom_sglang_rmsnorm"](_Rank())  # type: ignore[arg-type]
    reason = adapter.unavailable()
    assert reason is not None
    assert "sgl_kernel" in reason
