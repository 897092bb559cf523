"""One A/B case inside a rank (gpu/ab/correctness.py ``run_case``) on the CPU: FlashInfer and
CUDA graphs are fakes that write the fp32 reference, so what is checked is the case's own
frame: which outputs are compared at which stage, the NaN fill before every call (a replay
that writes nothing fails), and the custom all-reduce's flags."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from sm120fork.gpu.ab import correctness
from sm120fork.gpu.core.cases import Case
from sm120fork.gpu.core.reference import expected, generate


class _Graph:
    def __init__(self) -> None:
        self.ops: list[Callable[[], None]] = []
        self.replays_write = True

    def replay(self) -> None:
        for op in self.ops if self.replays_write else ():
            op()


class _FlashInfer:
    """The fused calls, writing the fp32 reference of ``case`` into the outputs given."""

    AllReduceFusionOp = type("Op", (), {"RESIDUAL_RMS_NORM": 1})
    AllReduceStrategyType = type("Strategy", (), {"ONESHOT": 0})
    QuantizationSFLayout = type("Layout", (), {"LINEAR": 1})

    def __init__(self, case: Case) -> None:
        self.ref = expected(generate(case, "cpu"))
        self.capturing: _Graph | None = None
        self.flags: list[int] = []

    def _run(self, writes: dict[str, torch.Tensor | None]) -> None:
        def op() -> None:
            for name, out in writes.items():
                if out is not None:
                    out.copy_(self.ref[name].reshape(out.shape).to(out.dtype))
        if self.capturing is not None:
            self.capturing.ops.append(op)
        else:
            op()

    def allreduce_fusion(self, **kw: Any) -> None:
        self._run({"allreduce": kw["output"] if kw["pattern"] == 0 else None,
                   "residual": kw["residual_out"], "norm": kw["norm_out"]})

    def trtllm_custom_all_reduce(self, x: Any, norm: torch.Tensor, *args: Any) -> None:
        self.flags.append(args[7])
        self._run({"norm": norm, "residual": args[16]})


class _Rank:
    rank = 0
    device = torch.device("cpu")

    def __init__(self, fc: _FlashInfer) -> None:
        self.fc = fc
        self.flag = 1

    def barrier(self) -> None:
        pass

    def workspace(self, api: str) -> dict[str, Any]:
        return {"ptrs": [0] * 7}

    def reset_lamport(self, ws: object) -> None:
        pass

    def next_flag(self) -> int:
        self.flag += 1
        return self.flag - 1


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> list[_Graph]:
    """torch.cuda's synchronize, streams and graphs as CPU fakes; the graphs made."""
    graphs: list[_Graph] = []

    def graph() -> _Graph:
        graphs.append(_Graph())
        return graphs[-1]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", type("S", (), {
        "wait_stream": lambda self, other: None}))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    return graphs


def _case(api: str, tokens: int, pattern: str = "ar_rmsnorm") -> Case:
    return Case(world_size=2, api=api, pattern=pattern, tokens=tokens, hidden=64,
                dtype="bf16", strategy="oneshot", pdl=False)


def _capture(fc: _FlashInfer) -> Callable[..., Any]:
    @contextmanager
    def graph(g: _Graph, stream: object = None) -> Iterator[None]:
        fc.capturing = g
        yield
        fc.capturing = None
    return graph


@pytest.mark.parametrize("pattern", ["ar_rmsnorm", "allreduce"])
def test_a_fusion_case_checks_its_outputs_eagerly_and_on_two_graph_replays(
        cuda: list[_Graph], monkeypatch: pytest.MonkeyPatch, pattern: str) -> None:
    case = _case("fusion_unified", 4, pattern)
    fc = _FlashInfer(case)
    monkeypatch.setattr(torch.cuda, "graph", _capture(fc))
    result = correctness.run_case(_Rank(fc), case)  # type: ignore[arg-type]
    assert (result.key, result.status, result.failure) == (case.key, "pass", None)
    outputs = ["allreduce_out"] if pattern == "allreduce" else ["residual_out", "norm_out"]
    assert [(c.stage, c.output) for c in result.checks] == [
        (stage, out) for stage in ("eager", "graph replay 1", "graph replay 2")
        for out in outputs]
    assert all(c.ok and c.rel_l2 is not None and c.rel_l2 < 1e-2 for c in result.checks)
    (graph,) = cuda
    assert len(graph.ops) == 1


def test_a_replay_that_writes_nothing_fails_on_the_nan_fill(
        cuda: list[_Graph], monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case("fusion_unified", 4)
    fc = _FlashInfer(case)
    monkeypatch.setattr(torch.cuda, "graph", _capture(fc))

    def silent() -> _Graph:
        g = _Graph()
        g.replays_write = False
        cuda.append(g)
        return g

    monkeypatch.setattr(torch.cuda, "CUDAGraph", silent)
    result = correctness.run_case(_Rank(fc), case)  # type: ignore[arg-type]
    assert (result.status, result.failure) == ("fail", "wrong result")
    failing = [c for c in result.checks if not c.ok]
    assert {c.stage for c in failing} == {"graph replay 1", "graph replay 2"}
    assert all("NaN/Inf" in c.reason for c in failing)


def test_the_custom_all_reduce_captures_three_flags_on_its_lamport_path(
        cuda: list[_Graph], monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case("custom_lamport", 8)
    fc = _FlashInfer(case)
    monkeypatch.setattr(torch.cuda, "graph", _capture(fc))
    result = correctness.run_case(_Rank(fc), case)  # type: ignore[arg-type]
    assert result.status == "pass"
    assert len(cuda[0].ops) == 3
    assert fc.flags == [1, 2, 3, 4]  # eager, then the three captured calls
    assert result.note is None


def test_the_custom_all_reduce_off_its_lamport_path_runs_three_eager_calls_only(
        cuda: list[_Graph], monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case("custom_lamport", 17)
    fc = _FlashInfer(case)
    result = correctness.run_case(_Rank(fc), case)  # type: ignore[arg-type]
    assert result.status == "pass"
    assert cuda == []
    assert fc.flags == [1, 2, 3]
    assert [c.stage for c in result.checks][::2] == ["eager", "eager call 2", "eager call 3"]
    assert result.note == "eager only: host-side barrier flags cannot be graph-replayed"
