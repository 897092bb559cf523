"""The bench inside a rank: CUDA-graph timing of each method, the floors."""

from __future__ import annotations

import ctypes
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sm120fork.gpu.cases import BenchPlan
from sm120fork.gpu.rank import Rank, cuda_broken, say
from sm120fork.gpu.reference import RMS_EPS, TORCH_DTYPES


def _time_graph(rk: Rank, build: Callable[[int], Callable[[], None]], *, rotate: int,
                calls_per_buffer: int, replays: int) -> list[float]:
    """Per-op microseconds of each timed replay of a graph cycling ``rotate`` buffers."""
    fns = [build(i) for i in range(rotate)]
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    rk.barrier()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls_per_buffer):
            for fn in fns:
                fn()
    torch.cuda.synchronize()
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


def _summary(samples: list[float]) -> dict[str, float]:
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


def run_bench(rk: Rank, plan: BenchPlan) -> None:
    dtype = TORCH_DTYPES[plan.dtype]
    rotate, calls_per_buffer, replays = plan.rotate, plan.calls_per_buffer, plan.replays
    if rk.shared:  # time-sliced ranks: numbers mean nothing, keep the run short
        rotate, calls_per_buffer, replays = 2, 2, 5
    dev = rk.device
    skipped: dict[str, str] = {}
    try:
        ws: Any = rk.workspace("fusion_unified")
        fused_api = "fusion_unified"
    except Exception as exc:
        if cuda_broken(exc):
            raise
        skipped["fused via unified API"] = f"{type(exc).__name__}: {exc}"[:300]
        ws = rk.workspace("fusion_legacy")
        fused_api = "fusion_legacy"
    nccl_group = None
    if rk.shared:
        skipped["nccl_rmsnorm"] = ("ranks share a GPU: NCCL refuses two ranks on one GPU, so "
                                   "the NCCL + RMSNorm baseline cannot run")
    else:
        try:
            nccl_group = dist.new_group(list(range(rk.world)), backend="nccl")
        except Exception as exc:
            skipped["nccl_rmsnorm"] = f"NCCL unavailable: {type(exc).__name__}: {exc}"[:300]
    say("BENCH", {"kind": "meta", "fused_api": fused_api, "skipped": skipped,
                  "shared": rk.shared, "rotate": rotate, "calls_per_buffer": calls_per_buffer,
                  "replays": replays})

    # floors
    try:
        tiny = torch.zeros(1, device=dev)

        def bump(_i: int) -> Callable[[], None]:
            def run() -> None:
                tiny.add_(1.0)
            return run

        # Same graph shape as the methods (rotate x calls ops per replay), per op.
        samples = _time_graph(rk, bump, rotate=rotate, calls_per_buffer=calls_per_buffer,
                              replays=max(replays, 20))
        say("BENCH", {"kind": "floor", "method": "empty_graph", **_summary(samples)})
    except Exception as exc:
        say("BENCH", {"kind": "floor", "method": "empty_graph", "skipped": str(exc)[:300]})
    try:
        one_way = _flag_handoff_us(rk, iters=20 if rk.shared else 2000)
        say("BENCH", {"kind": "floor", "method": "flag_handoff", "median_us": one_way})
    except Exception as exc:
        say("BENCH", {"kind": "floor", "method": "flag_handoff",
                      "skipped": f"{type(exc).__name__}: {exc}"[:300]})

    for hidden in plan.hidden:
        for tokens in plan.tokens:
            _bench_point(rk, ws, fused_api, nccl_group, tokens, hidden, dtype,
                         rotate=rotate, calls_per_buffer=calls_per_buffer, replays=replays)


Buffers = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


def _bench_methods(rk: Rank, ws: Any, fused_api: str, nccl_group: Any, bufs: Buffers,
                   gamma: torch.Tensor, tokens: int, hidden: int,
                   ) -> dict[str, Callable[[int], Callable[[], None]]]:
    """Method name -> builder of the op on rotating buffer set ``i``."""
    from flashinfer.norm import fused_add_rmsnorm  # type: ignore[import-not-found, unused-ignore]

    fc = rk.fc
    methods: dict[str, Callable[[int], Callable[[], None]]] = {}

    def fused(oneshot: bool | None) -> Callable[[int], Callable[[], None]]:
        def build(i: int) -> Callable[[], None]:
            xin, res, r_out, n_out = bufs[i]
            if fused_api == "fusion_unified":
                def run_unified() -> None:
                    fc.allreduce_fusion(
                        input=xin, workspace=ws, pattern=1, launch_with_pdl=True,
                        residual_out=r_out, norm_out=n_out, residual_in=res,
                        rms_gamma=gamma, rms_eps=RMS_EPS, use_oneshot=oneshot)
                return run_unified

            def run_legacy() -> None:
                fc.trtllm_allreduce_fusion(
                    allreduce_in=xin.view(-1), world_size=rk.world, world_rank=rk.rank,
                    token_num=tokens, hidden_dim=hidden, workspace_ptrs=ws["tensor"],
                    launch_with_pdl=True, trigger_completion_at_end=True, fp32_acc=False,
                    pattern_code=1, use_oneshot=oneshot, allreduce_out=None,
                    residual_in=res.view(-1), residual_out=r_out.view(-1),
                    norm_out=n_out.view(-1), quant_out=None, scale_out=None,
                    rms_gamma=gamma, rms_eps=RMS_EPS, scale_factor=None, layout_code=None,
                    metadata=ws["metadata"])
            return run_legacy
        return build

    for strategy, oneshot in (("oneshot", True), ("twoshot", False), ("auto", None)):
        if strategy == "twoshot" and tokens <= rk.world:
            continue
        methods[f"fused_{strategy}"] = fused(oneshot)

    def norm_only(i: int) -> Callable[[], None]:
        xin, res, _r, _n = bufs[i]

        def run() -> None:
            fused_add_rmsnorm(xin, res, gamma, RMS_EPS)
        return run

    methods["rmsnorm_only"] = norm_only
    if nccl_group is not None:
        def nccl_norm(i: int) -> Callable[[], None]:
            xin, res, _r, _n = bufs[i]

            def run() -> None:
                dist.all_reduce(xin, group=nccl_group)
                fused_add_rmsnorm(xin, res, gamma, RMS_EPS)
            return run

        methods["nccl_rmsnorm"] = nccl_norm
    return methods


def _bench_point(rk: Rank, ws: Any, fused_api: str, nccl_group: Any, tokens: int,
                 hidden: int, dtype: torch.dtype, *, rotate: int, calls_per_buffer: int,
                 replays: int) -> None:
    dev = rk.device
    gamma = torch.ones(hidden, dtype=dtype, device=dev)
    bufs: Buffers = [(torch.randn(tokens, hidden, device=dev).to(dtype),
                      torch.randn(tokens, hidden, device=dev).to(dtype),
                      torch.empty(tokens, hidden, dtype=dtype, device=dev),
                      torch.empty(tokens, hidden, dtype=dtype, device=dev))
                     for _ in range(rotate)]
    methods = _bench_methods(rk, ws, fused_api, nccl_group, bufs, gamma, tokens, hidden)
    for method, build in methods.items():
        record: dict[str, Any] = {"kind": "point", "method": method, "tokens": tokens,
                                  "hidden": hidden}
        try:
            samples = _time_graph(rk, build, rotate=rotate,
                                  calls_per_buffer=calls_per_buffer, replays=replays)
            gathered: list[Any] = [None] * rk.world
            dist.all_gather_object(gathered, statistics.median(samples))
            record.update(_summary(samples), rank_medians_us=gathered)
        except Exception as exc:
            if cuda_broken(exc):
                raise
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
            rk.barrier()
        if rk.rank == 0:
            say("BENCH", record)

