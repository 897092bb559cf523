"""The bench inside a rank: each method checked against the fp32 reference, then timed
in CUDA-graph replays; the floors (empty graph op, flag handoff)."""

from __future__ import annotations

import ctypes
import functools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from sm120fork.gpu.bench.adapters import FACTORIES, Adapter, BufferSet, Unbuilt
from sm120fork.gpu.bench.drive import Point, drive
from sm120fork.gpu.core.cases import BenchPlan, Case
from sm120fork.gpu.core.rank import Rank, cuda_broken, say
from sm120fork.gpu.core.reference import TORCH_DTYPES, compare, expected, generate
from sm120fork.gpu.methods import METHODS


def _capture(fns: Sequence[Callable[[], None]], repeat: int = 1) -> Any:
    """A CUDA graph of ``fns``, ``repeat`` times over, captured on a side stream."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(repeat):
            for fn in fns:
                fn()
    torch.cuda.synchronize()
    return graph


def _time_graph(rk: Rank, build: Callable[[int], Callable[[], None]], *, rotate: int,
                calls_per_buffer: int, replays: int,
                after_capture: Callable[[], None] = lambda: None) -> list[float]:
    """Per-op microseconds of each timed replay of a graph cycling ``rotate`` buffers."""
    fns = [build(i) for i in range(rotate)]
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    rk.barrier()
    graph = _capture(fns, calls_per_buffer)
    after_capture()
    rk.barrier()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    rk.barrier()
    events = [(torch.cuda.Event(enable_timing=True),  # type: ignore[no-untyped-call]
               torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
              for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    n_ops = rotate * calls_per_buffer
    return [s.elapsed_time(e) * 1000.0 / n_ops for s, e in events]


def summary(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else samples * 9
    return {"median_us": statistics.median(samples), "p10_us": q[0], "p90_us": q[-1],
            "samples": len(samples)}


def _flag_handoff_us(rk: Rank, iters: int) -> float | None:
    """One-way latency of a flag written by rank 0 into rank 1's memory (ping-pong / 2)."""
    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]

    src = r"""
    extern "C" __global__ void pingpong(volatile int* mine, volatile int* peer, int iters,
                                        int role, int base) {
      for (int i = 1; i <= iters; ++i) {
        int v = base + i;
        if (role == 0) { peer[0] = v; __threadfence_system(); while (mine[0] != v) {} }
        else { while (mine[0] != v) {} peer[0] = v; __threadfence_system(); }
      }
    }"""
    kernel = cupy.RawKernel(src, "pingpong")
    ptrs = rk.fc.create_shared_buffer(2 << 20, None)
    rk.fc.cuda_ipc.cudart.cudaMemset(ctypes.c_void_p(ptrs[rk.rank]), 0, 64)
    torch.cuda.synchronize()
    rk.barrier()
    results = []
    stream = torch.cuda.current_stream()
    for rep in range(5):
        base = rep * iters
        rk.barrier()
        if rk.rank < 2:
            peer = ptrs[1 - rk.rank]
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            with cupy.cuda.Device(rk.device.index), cupy.cuda.ExternalStream(stream.cuda_stream):
                kernel((1,), (1,), (cupy.uint64(ptrs[rk.rank]), cupy.uint64(peer),
                                    cupy.int32(iters), cupy.int32(rk.rank), cupy.int32(base)))
            end.record()
            torch.cuda.synchronize()
            results.append(start.elapsed_time(end) * 1000.0 / (2 * iters))
        torch.cuda.synchronize()
    rk.barrier()
    return statistics.median(results) if results else None


def measure(rk: Rank, plan: BenchPlan, methods: list[str]) -> None:
    """Every method checked, then timed, at every point of ``plan``; rank 0 says each."""
    rotate, calls_per_buffer, replays = plan.rotate, plan.calls_per_buffer, plan.replays
    if rk.shared:  # time-sliced ranks: numbers mean nothing, keep the run short
        rotate, calls_per_buffer, replays = 2, 2, 5
    say("BENCH", {"kind": "meta", "methods": methods, "shared": rk.shared,
                  "rotate": rotate, "calls_per_buffer": calls_per_buffer,
                  "replays": replays})
    if plan.floors:
        _floors(rk, rotate, calls_per_buffer, replays)
    failed_modules: dict[str, str] = dict(rk.spec.get("module_failures", {}))
    adapters = [Unbuilt(rk, name, f"FlashInfer's {METHODS[name].module} module did not "
                        f"build: {failed_modules[METHODS[name].module or '']}")
                if METHODS[name].module in failed_modules else FACTORIES[name](rk)
                for name in methods]
    points = _Points(rk, plan, rotate)

    def time(adapter: Adapter, point: Point) -> dict[str, Any]:
        return summary(_time_graph(rk, adapter.op, rotate=rotate,
                                   calls_per_buffer=calls_per_buffer, replays=replays,
                                   after_capture=adapter.after_capture))

    def emit(record: dict[str, Any]) -> None:
        if rk.rank == 0:
            say("BENCH", record)

    def gather(value: Any) -> list[Any]:
        every: list[Any] = [None] * rk.world
        dist.all_gather_object(every, value)
        return every

    drive(adapters, [Point(tokens=t, hidden=h) for h in plan.hidden for t in plan.tokens],
          check=points.check, time=time, emit=emit, gather=gather, is_fatal=cuda_broken)


class _Points:
    """Each point's buffers, inputs and fp32 reference, shared by every method."""

    def __init__(self, rk: Rank, plan: BenchPlan, rotate: int) -> None:
        self.rk, self.plan, self.rotate = rk, plan, rotate
        self.dtype = TORCH_DTYPES[plan.dtype]
        self.point: Point | None = None
        self.bufs: list[BufferSet] = []
        self.gamma = torch.empty(0)
        self.data: Any = None
        self.ref: dict[str, torch.Tensor] = {}

    def _at(self, point: Point) -> None:
        if self.point != point:
            dev, dtype = self.rk.device, self.dtype
            empty = functools.partial(torch.empty, point.tokens, point.hidden, dtype=dtype,
                                      device=dev)
            self.point = point
            self.bufs = [(empty(), empty(), empty(), empty()) for _ in range(self.rotate)]
            self.gamma = torch.empty(point.hidden, dtype=dtype, device=dev)
            # the point as a correctness case: its seed regenerates every rank's inputs
            self.data = generate(Case(
                world_size=self.rk.world, api="fusion_unified", pattern="ar_rmsnorm",
                tokens=point.tokens, hidden=point.hidden, dtype=self.plan.dtype,
                strategy="auto", pdl=True), dev)
            self.ref = expected(self.data)

    def _load(self, i: int) -> None:
        """Every rank's input of the point's case into set ``i``; outputs NaN."""
        x, res, r_out, n_out = self.bufs[i]
        x.copy_(self.data.inputs[self.rk.rank])
        res.copy_(self.data.residual)
        r_out.fill_(float("nan"))
        n_out.fill_(float("nan"))
        self.gamma.copy_(self.data.gamma)
        torch.cuda.synchronize()
        self.rk.barrier()

    def _verify(self, adapter: Adapter, stage: str) -> list[dict[str, Any]]:
        torch.cuda.synchronize()
        residual, norm = adapter.outputs(0)
        return [{**compare(name, got, self.ref[name], self.plan.dtype, self.rk.world),
                 "stage": stage} for name, got in (("residual", residual), ("norm", norm))]

    def check(self, adapter: Adapter, point: Point) -> tuple[bool, list[dict[str, Any]]]:
        """The method's outputs eagerly, then in a CUDA-graph replay, on the same inputs."""
        self._at(point)
        adapter.bind(self.bufs, self.gamma, point)
        self._load(0)
        adapter.op(0)()
        checks = self._verify(adapter, "eager")
        graph = _capture([adapter.op(0)])
        adapter.after_capture()
        self._load(0)
        graph.replay()
        checks += self._verify(adapter, "graph replay")
        del graph
        return all(c["ok"] for c in checks), checks


def _floors(rk: Rank, rotate: int, calls_per_buffer: int, replays: int) -> None:
    try:
        tiny = torch.zeros(1, device=rk.device)

        def bump(_i: int) -> Callable[[], None]:
            def run() -> None:
                tiny.add_(1.0)
            return run

        # Same graph shape as the methods (rotate x calls ops per replay), per op.
        samples = _time_graph(rk, bump, rotate=rotate, calls_per_buffer=calls_per_buffer,
                              replays=max(replays, 20))
        say("BENCH", {"kind": "floor", "method": "empty_graph", **summary(samples)})
    except Exception as exc:
        if cuda_broken(exc):
            raise
        say("BENCH", {"kind": "floor", "method": "empty_graph", "skipped": str(exc)[:300]})
    try:
        one_way = _flag_handoff_us(rk, iters=20 if rk.shared else 2000)
        say("BENCH", {"kind": "floor", "method": "flag_handoff", "median_us": one_way})
    except Exception as exc:
        if cuda_broken(exc):
            raise
        say("BENCH", {"kind": "floor", "method": "flag_handoff",
                      "skipped": f"{type(exc).__name__}: {exc}"[:300]})
