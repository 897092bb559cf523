"""The bench inside a rank, ``python -m sm120fork.gpu.bench.timing SPEC RANK``: every method
of :data:`sm120fork.gpu.methods.METHODS` driven the same way (:func:`drive`): one that
cannot run here says why and is reported as not runnable, one whose output does not match
the fp32 reference is reported with its failing check and never timed, the rest are timed
in CUDA-graph replays; and the floors (empty graph op, flag handoff)."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from sm120fork.gpu.bench.adapters import FACTORIES, Adapter, Point
from sm120fork.gpu.core import worker
from sm120fork.gpu.core.cases import BenchPlan, Case
from sm120fork.gpu.core.documents import BenchRecord, CheckVerdict
from sm120fork.gpu.core.rank import Rank, capture_graph, cuda_broken, say
from sm120fork.gpu.core.reference import TORCH_DTYPES, compare, expected, generate
from sm120fork.gpu.methods import ERROR, FAILED_CHECK, METHODS, NOT_RUNNABLE, STARTING, TIMED
from sm120fork.util import typed


def _time_graph(rk: Rank, build: Callable[[int], Callable[[], None]], plan: BenchPlan,
                after_capture: Callable[[], None] = lambda: None) -> list[float]:
    """Per-op microseconds of each timed replay of a graph cycling ``plan.rotate`` buffers."""
    fns = [build(i) for i in range(plan.rotate)]
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    rk.barrier()
    graph = capture_graph(fns, plan.calls_per_buffer)
    after_capture()
    rk.barrier()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    rk.barrier()
    events = [(torch.cuda.Event(enable_timing=True),  # type: ignore[no-untyped-call]
               torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
              for _ in range(plan.replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    n_ops = plan.rotate * plan.calls_per_buffer
    return [s.elapsed_time(e) * 1000.0 / n_ops for s, e in events]


def summary(samples: list[float]) -> BenchRecord:
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
    if rk.shared:  # time-sliced ranks: numbers mean nothing, keep the run short
        plan = dataclasses.replace(plan, rotate=2, calls_per_buffer=2, replays=5)
    say("BENCH", {"kind": "meta", "methods": methods, "shared": rk.shared,
                  "rotate": plan.rotate, "calls_per_buffer": plan.calls_per_buffer,
                  "replays": plan.replays})
    if plan.floors:
        _floors(rk, plan)
    failed_modules: dict[str, str] = dict(rk.spec.get("module_failures", {}))
    adapters = [Adapter(rk, name, f"FlashInfer's {METHODS[name].module} module did not "
                        f"build: {failed_modules[METHODS[name].module or '']}")
                if METHODS[name].module in failed_modules else FACTORIES[name](rk)
                for name in methods]

    def time(adapter: Adapter, point: Point) -> BenchRecord:
        return summary(_time_graph(rk, adapter.op, plan, adapter.after_capture))

    def emit(record: BenchRecord) -> None:
        if rk.rank == 0:
            say("BENCH", record)

    def gather(value: Any) -> list[Any]:
        every: list[Any] = [None] * rk.world
        dist.all_gather_object(every, value)
        return every

    drive(adapters, [Point(tokens=t, hidden=h) for h in plan.hidden for t in plan.tokens],
          check=functools.partial(_check, rk, plan), time=time, emit=emit,
          gather=gather, is_fatal=cuda_broken)


def _check(rk: Rank, plan: BenchPlan, adapter: Adapter, point: Point,
           ) -> tuple[bool, list[CheckVerdict]]:
    """The method's outputs against the fp32 reference, eagerly, then in a CUDA-graph
    replay, on the same inputs."""
    dev, dtype = rk.device, TORCH_DTYPES[plan.dtype]
    empty = functools.partial(torch.empty, point.tokens, point.hidden, dtype=dtype, device=dev)
    bufs = [(empty(), empty(), empty(), empty()) for _ in range(plan.rotate)]
    gamma = torch.empty(point.hidden, dtype=dtype, device=dev)
    # the point as a correctness case: its seed regenerates every rank's inputs
    data = generate(Case(world_size=rk.world, api="fusion_unified", pattern="ar_rmsnorm",
                         tokens=point.tokens, hidden=point.hidden, dtype=plan.dtype,
                         strategy="auto", pdl=True), dev)
    ref = expected(data)

    def load() -> None:
        """Every rank's input into set 0; its outputs NaN."""
        x, res, r_out, n_out = bufs[0]
        x.copy_(data.inputs[rk.rank])
        res.copy_(data.residual)
        r_out.fill_(float("nan"))
        n_out.fill_(float("nan"))
        gamma.copy_(data.gamma)
        torch.cuda.synchronize()
        rk.barrier()

    def verify(stage: str) -> list[CheckVerdict]:
        torch.cuda.synchronize()
        residual, norm = adapter.outputs(0)
        return [compare(name, got, ref[name], plan.dtype, rk.world, stage=stage)
                for name, got in (("residual", residual), ("norm", norm))]

    adapter.bind(bufs, gamma, point)
    load()
    adapter.op(0)()
    checks = verify("eager")
    graph = capture_graph([adapter.op(0)])
    adapter.after_capture()
    load()
    graph.replay()
    checks += verify("graph replay")
    del graph
    return all(c["ok"] for c in checks), checks


def _floors(rk: Rank, plan: BenchPlan) -> None:
    def empty_graph() -> BenchRecord:
        tiny = torch.zeros(1, device=rk.device)

        def bump() -> None:
            tiny.add_(1.0)

        # Same graph shape as the methods (rotate x calls ops per replay), per op.
        return summary(_time_graph(rk, lambda _i: bump,
                                   dataclasses.replace(plan, replays=max(plan.replays, 20))))

    def flag_handoff() -> BenchRecord:
        return {"median_us": _flag_handoff_us(rk, iters=20 if rk.shared else 2000)}

    for name, measured in (("empty_graph", empty_graph), ("flag_handoff", flag_handoff)):
        try:
            say("BENCH", {"kind": "floor", "method": name, **measured()})
        except Exception as exc:
            if cuda_broken(exc):
                raise
            say("BENCH", {"kind": "floor", "method": name,
                          "skipped": f"{type(exc).__name__}: {exc}"[:300]})


#: check(adapter, point) -> (ok, checks); time(adapter, point) -> stats
Check = Callable[[Any, Point], tuple[bool, list[CheckVerdict]]]
Time = Callable[[Any, Point], BenchRecord]


def agree(reasons: Sequence[str | None]) -> str | None:
    """One verdict for the group from every rank's: a method runs only if it runs on all."""
    bad = [(rank, r) for rank, r in enumerate(reasons) if r]
    if not bad:
        return None
    rank, reason = bad[0]
    return reason if len(bad) == len(reasons) else f"rank {rank}: {reason}"


def drive(adapters: Sequence[Any], points: Sequence[Point], *, check: Check, time: Time,
          emit: Callable[[BenchRecord], None],
          gather: Callable[[Any], list[Any]] = lambda x: [x],
          is_fatal: Callable[[BaseException], bool] = lambda _exc: False) -> None:
    """Check, then time, every runnable method at every point; report the others.

    Method by method, each set up just before its points: a method that kills the ranks
    (a CUDA error poisons the context) leaves the methods before it measured, and its
    ``kind: method`` record with status ``starting`` tells the launcher which one to skip
    when it resumes.

    ``gather`` collects one value from every rank (identity on one rank), so that every
    rank takes the same branch: a method is checked only where every rank can run it,
    and timed only where every rank's check passed.  ``is_fatal`` says which errors
    poisoned the process (they propagate).
    """
    def attempt(call: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        """``call(*args)``, or None and the error it raised (a fatal one propagates)."""
        try:
            return call(*args), None
        except Exception as exc:
            if is_fatal(exc):
                raise
            return None, f"{type(exc).__name__}: {exc}"

    def at(adapter: Any, point: Point) -> BenchRecord:
        """The outcome of one method at one point, the same on every rank."""
        if reason := agree(gather(adapter.unsupported(point))):
            return {"status": NOT_RUNNABLE, "reason": reason}
        checked, error = attempt(check, adapter, point)
        ok, checks = checked or (False, [CheckVerdict(output="call", ok=False,
                                                      reason=str(error)[:500])])
        verdicts = gather((ok, checks))
        if failing := [rank for rank, v in enumerate(verdicts) if not v[0]]:
            worst = verdicts[failing[0]][1]
            return {"status": FAILED_CHECK, "failing_ranks": failing, "checks": worst,
                    "reason": "; ".join(str(c.get("reason")) for c in worst
                                        if not c.get("ok"))[:800]}
        stats, error = attempt(time, adapter, point)
        every = gather(stats if error is None else {"error": error[:500]})
        if errors := [s["error"] for s in every if "error" in s]:
            return {"status": ERROR, "reason": errors[0]}
        timed: BenchRecord = stats
        return {**timed, "status": TIMED, "checks": checks,
                "rank_medians_us": [s["median_us"] for s in every],
                "rank_p90_us": [s["p90_us"] for s in every]}

    for adapter in adapters:
        emit({"kind": "method", "method": adapter.name, "status": STARTING})
        own, error = attempt(adapter.unavailable)
        if reason := agree(gather(own if error is None else f"set-up failed: {error}"[:500])):
            emit({"kind": "method", "method": adapter.name, "status": NOT_RUNNABLE,
                  "reason": reason})
            continue
        for point in points:
            emit({"kind": "point", "method": adapter.name, "tokens": point.tokens,
                  "hidden": point.hidden, **at(adapter, point)})


@dataclasses.dataclass(frozen=True)
class _BenchSpec:
    """What a bench rank reads of the group's spec (the rest is :class:`Rank`'s)."""

    bench: BenchPlan
    methods: list[str]


def run(rank: Rank, spec: object) -> None:
    read = typed.read(_BenchSpec, spec, "the bench spec", strict=False)
    measure(rank, read.bench, read.methods)


if __name__ == "__main__":
    worker.serve({"bench": run})
