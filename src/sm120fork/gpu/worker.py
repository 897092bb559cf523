"""Code that runs inside one rank process: ``python -m sm120fork.gpu.worker SPEC RANK``.

Ranks talk through a gloo process group (FileStore rendezvous) and CUDA IPC buffers set
up by FlashInfer's own helpers, so several ranks may share one GPU; NCCL is used only
by the benchmark's baseline, and only when every rank has a GPU of its own.  Results go
to stdout as protocol lines (:mod:`sm120fork.gpu.protocol`).

FlashInfer and torch are untyped here; the ``type: ignore`` comments are confined to
their calls.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sm120fork.gpu import protocol
from sm120fork.gpu.cases import CUSTOM_API, PATTERN_CODES, BenchPlan, Case, skip_reason
from sm120fork.gpu.reference import (
    FP4_BLOCK,
    RMS_EPS,
    TORCH_DTYPES,
    compare,
    dequant_fp4_linear,
    dequant_fp8,
    expected,
    fp4_global_scale,
    fp8_scale,
    generate,
)
from sm120fork.gpu.safety import MULTICAST_OFF_ENV, check_backend

EXIT_CUDA_ERROR = 3
EXIT_FATAL = 4


def say(tag: str, payload: Any = None) -> None:
    print(protocol.emit(tag, payload), flush=True)


def stage(name: str) -> None:
    """Plain progress line: a hung case's log tail then says where it hung."""
    print(f"stage: {name}", flush=True)


def hard_exit(code: int) -> None:
    """Exit without interpreter teardown: with a poisoned CUDA context, or IPC mappings and
    a gloo group still open, destructors and atexit hooks can hang, and a hung exit would
    look like a hung case to the watchdog."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cuda_broken(exc: BaseException) -> bool:
    """A CUDA error poisons the context: the launcher must restart the ranks."""
    if isinstance(exc, WorkspaceError):
        return False
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(s in text for s in ("cuda error", "illegal memory", "illegal address",
                                   "an illegal", "unspecified launch", "cudaerror",
                                   "device-side assert", "misaligned address",
                                   "failed with error code", "cuda_error"))


class WorkspaceError(RuntimeError):
    """Creating an API's workspace failed; every case of that API fails with it."""


class Rank:
    """One rank's process-wide state: process group, device, workspaces, flag counter."""

    def __init__(self, spec: dict[str, Any], rank: int) -> None:
        for name, value in MULTICAST_OFF_ENV.items():
            if os.environ.get(name) != value:
                raise RuntimeError(f"refusing to run: {name} must be {value} in every rank")
        self.spec = spec
        self.rank = rank
        self.world = int(spec["world_size"])
        self.backend = check_backend(spec.get("backend", "trtllm"),
                                     allow_multicast=bool(spec.get("allow_multicast")))
        n_dev = torch.cuda.device_count()
        if n_dev == 0:
            say("FATAL", "no CUDA device visible to the rank")
            hard_exit(EXIT_FATAL)
        self.device_count = n_dev
        self.shared = self.world > n_dev
        self.device = torch.device("cuda", rank % n_dev)
        torch.cuda.set_device(self.device)
        store = dist.FileStore(  # type: ignore[attr-defined]
            spec["store"], self.world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=self.world)
        self.capability: tuple[int, int] = tuple(  # type: ignore[assignment]
            torch.cuda.get_device_capability(self.device))
        if not self.shared:
            self._require_p2p()
        import flashinfer.comm as fc  # type: ignore[import-not-found, unused-ignore]

        self.fc = fc
        self.flag = 1
        self._workspaces: dict[str, Any] = {}
        self._workspace_errors: dict[str, str] = {}

    def _require_p2p(self) -> None:
        for peer in range(self.world):
            other = peer % self.device_count
            if other != self.device.index and not torch.cuda.can_device_access_peer(
                    self.device.index, other):
                say("FATAL", f"GPU {self.device.index} cannot access GPU {other} peer-to-peer "
                    "(P2P disabled by driver or topology); the fused all-reduce needs P2P "
                    "through CUDA IPC, so it must stay disabled on this machine")
                hard_exit(EXIT_FATAL)

    def barrier(self) -> None:
        dist.barrier()

    # ---- workspaces ------------------------------------------------------------------
    def workspace(self, api: str) -> Any:
        """Create each API's workspace once per process, sized for the whole batch."""
        if api in self._workspace_errors:
            raise RuntimeError(f"workspace creation failed earlier: {self._workspace_errors[api]}")
        if api not in self._workspaces:
            try:
                self._workspaces[api] = self._create_workspace(api)
            except Exception as exc:
                # Driver-API errors from allocation or handle exchange do not poison the
                # context; fail this API's cases quickly instead of restarting per case.
                self._workspace_errors[api] = f"{type(exc).__name__}: {exc}"
                raise WorkspaceError(f"{api} workspace: {self._workspace_errors[api]}") from exc
        return self._workspaces[api]

    def _create_workspace(self, api: str) -> Any:
        fc = self.fc
        max_tokens = int(self.spec["max_tokens"])
        max_hidden = int(self.spec["max_hidden"])
        if api == "fusion_legacy":
            _handles, tensor, metadata = fc.trtllm_create_ipc_workspace_for_all_reduce_fusion(
                self.rank, self.world, max_tokens, max_hidden, use_fp32_lamport=False,
                group=None, create_metadata=True)
            return {"tensor": tensor, "metadata": metadata}
        if api == "fusion_unified":
            return fc.create_allreduce_fusion_workspace(
                backend=self.backend, world_size=self.world, rank=self.rank,
                max_token_num=max_tokens, hidden_dim=max_hidden, dtype=torch.bfloat16,
                gpus_per_node=min(self.world, self.device_count))
        if api == CUSTOM_API:
            custom_tokens = int(self.spec.get("custom_max_tokens", max_tokens))
            handles = fc.trtllm_create_ipc_workspace_for_all_reduce(
                self.rank, self.world, custom_tokens, max_hidden, group=None)
            flag_bytes = (fc.trtllm_ar.MAX_ALL_REDUCE_BLOCKS + 1) * 4 * self.world * 2
            cudart = fc.cuda_ipc.cudart
            for idx in (2, 3):  # barrier flags must start at zero (cudaMalloc does not clear)
                cudart.cudaMemset(ctypes.c_void_p(handles[idx][self.rank]), 0, flag_bytes)
            torch.cuda.synchronize()
            self.barrier()
            # lamportInitializeAll divides its size by sizeof(T): it takes bytes.
            lamport_bytes = self.world * fc.trtllm_ar.LamportTokenNumThreshold * self.world \
                * max_hidden * 2
            ptrs = [torch.tensor(h, dtype=torch.int64) for h in handles]
            return {"handles": handles, "ptrs": ptrs, "lamport_bytes": lamport_bytes}
        raise ValueError(f"unknown api {api}")

    def reset_lamport(self, ws: dict[str, Any]) -> None:
        """Re-fill this rank's three lamport buffers with -0 so no case sees another's data."""
        h = ws["handles"]
        self.fc.trtllm_lamport_initialize_all(h[4][self.rank], h[5][self.rank],
                                              h[6][self.rank], ws["lamport_bytes"],
                                              torch.float16)
        torch.cuda.synchronize()
        self.barrier()

    def next_flag(self, n: int = 1) -> int:
        first = self.flag
        self.flag += n
        return first


# ---- one correctness case --------------------------------------------------------------
def _nan_fill(t: torch.Tensor) -> None:
    if t.dtype in (torch.bfloat16, torch.float16, torch.float32):
        t.fill_(float("nan"))
    elif t.dtype == torch.float8_e4m3fn:
        t.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
    else:
        t.fill_(0xFF)


def run_case(rk: Rank, case: Case) -> dict[str, Any]:
    fc = rk.fc
    dtype = TORCH_DTYPES[case.dtype]
    data = generate(case, rk.device)
    ref = expected(data)
    x = data.inputs[rk.rank].contiguous()
    t, h = case.tokens, case.hidden
    outs: dict[str, torch.Tensor] = {}
    checks: list[tuple[str, str, torch.Tensor]] = []  # (output, kind, reference)
    pattern = case.pattern
    quant = pattern.endswith(("fp8", "fp4"))
    scale_tensor: torch.Tensor | None = None
    fp4_scale = 0.0

    def new(name: str, shape: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
        outs[name] = torch.empty(shape, dtype=dt, device=rk.device)
        return outs[name]

    new("allreduce_out", (t, h), dtype)
    if pattern == "allreduce":
        checks.append(("allreduce_out", case.dtype, ref["allreduce"]))
    else:
        new("residual_out", (t, h), dtype)
        checks.append(("residual_out", case.dtype, ref["residual"]))
        if not quant or "_out_" in pattern:
            new("norm_out", (t, h), dtype)
            checks.append(("norm_out", case.dtype, ref["norm"]))
    if pattern.endswith("fp8"):
        new("quant_out", (t, h), torch.float8_e4m3fn)
        scale_tensor = torch.tensor([fp8_scale(ref["norm"])], dtype=torch.float32,
                                    device=rk.device)
        checks.append(("quant_out", "fp8", ref["norm"]))
    elif pattern.endswith("fp4"):
        new("quant_out", (t, h // 2), torch.uint8)
        sf_elems = fc.compute_fp4_swizzled_layout_sf_size(t, h // FP4_BLOCK)
        new("scale_out", (sf_elems,), torch.uint8)
        fp4_scale = fp4_global_scale(ref["norm"])
        scale_tensor = torch.tensor([fp4_scale], dtype=torch.float32, device=rk.device)
        checks.append(("quant_out", "fp4", ref["norm"]))

    use_oneshot = {"oneshot": True, "twoshot": False, "auto": None}[case.strategy]
    layout = fc.QuantizationSFLayout.LINEAR if pattern.endswith("fp4") else None
    residual_in = None if pattern == "allreduce" else data.residual
    gamma = None if pattern == "allreduce" else data.gamma

    def flat(name: str) -> torch.Tensor | None:
        return outs[name].view(-1) if name in outs else None

    if case.api == "fusion_legacy":
        ws = rk.workspace(case.api)

        def call_once() -> None:
            fc.trtllm_allreduce_fusion(
                allreduce_in=x.view(-1), world_size=case.world_size, world_rank=rk.rank,
                token_num=t, hidden_dim=h, workspace_ptrs=ws["tensor"],
                launch_with_pdl=case.pdl, trigger_completion_at_end=case.pdl,
                fp32_acc=False, pattern_code=PATTERN_CODES[pattern], use_oneshot=use_oneshot,
                allreduce_out=flat("allreduce_out"),
                residual_in=None if residual_in is None else residual_in.view(-1),
                residual_out=flat("residual_out"), norm_out=flat("norm_out"),
                quant_out=flat("quant_out"), scale_out=outs.get("scale_out"),
                rms_gamma=gamma, rms_eps=RMS_EPS, scale_factor=scale_tensor,
                layout_code=layout, metadata=ws["metadata"])

        calls: Callable[[], None] = call_once
        graph_calls = 1
    elif case.api == "fusion_unified":
        uws = rk.workspace(case.api)

        def call_unified() -> None:
            fc.allreduce_fusion(
                input=x, workspace=uws, pattern=PATTERN_CODES[pattern],
                launch_with_pdl=case.pdl, output=outs["allreduce_out"],
                residual_out=outs.get("residual_out"), norm_out=outs.get("norm_out"),
                quant_out=outs.get("quant_out"), scale_out=outs.get("scale_out"),
                residual_in=residual_in, rms_gamma=gamma, rms_eps=RMS_EPS,
                scale_factor=scale_tensor, layout_code=layout, use_oneshot=use_oneshot,
                fp32_acc=False)

        calls = call_unified
        graph_calls = 1
    else:
        cws = rk.workspace(case.api)
        rk.reset_lamport(cws)
        p = cws["ptrs"]
        inter = outs["residual_out"]
        norm = outs["norm_out"]

        def call_custom(flag: int) -> None:
            fc.trtllm_custom_all_reduce(
                x, norm, case.world_size, rk.rank, t,
                fc.AllReduceFusionOp.RESIDUAL_RMS_NORM, fc.AllReduceStrategyType.ONESHOT,
                0, case.pdl, flag, p[0], p[2], p[3], None, data.residual, data.gamma, None,
                RMS_EPS, inter, p[4], p[5], p[6])

        # The flag is a host argument baked into a graph: capture three consecutive
        # flags so that replays cycle the lamport triple buffer like eager calls do.
        def call_next_flag() -> None:
            call_custom(rk.next_flag())

        calls = call_next_flag
        graph_calls = 3

    def verify(stage: str) -> list[dict[str, Any]]:
        verdicts = []
        for name, kind, reference in checks:
            got = outs[name]
            if kind == "fp8":
                got = dequant_fp8(got, float(scale_tensor))  # type: ignore[arg-type]
            elif kind == "fp4":
                got = dequant_fp4_linear(got, outs["scale_out"], fp4_scale, (t, h))
            v = compare(name, got, reference, kind, case.world_size)
            v["stage"] = stage
            verdicts.append(v)
        return verdicts

    def fill() -> None:
        for tensor in outs.values():
            _nan_fill(tensor)
        torch.cuda.synchronize()
        rk.barrier()

    stage("eager call")
    fill()
    calls()
    torch.cuda.synchronize()
    verdicts = verify("eager")
    if case.api == CUSTOM_API and not case.lamport:
        # The non-lamport path synchronizes ranks with flag barriers that compare for
        # equality against a host-side flag.  Baked into a graph, the flags repeat on the
        # second replay, a stale flag satisfies a barrier, and a rank that runs ahead
        # overwrites a slot a slower rank still waits on: a hang whenever ranks are not
        # in lock step (seen with ranks sharing a GPU; FlashInfer's own fusion API keeps
        # its flags on the device).  So this path is checked with eager calls only, each
        # with the next flag.
        for call in range(2):
            stage(f"eager call {call + 2}")
            fill()
            calls()
            torch.cuda.synchronize()
            verdicts += verify(f"eager call {call + 2}")
        ok = all(v["ok"] for v in verdicts)
        return {"status": "pass" if ok else "fail",
                "failure": None if ok else "wrong result", "checks": verdicts,
                "note": "eager only: host-side barrier flags cannot be graph-replayed"}
    stage("graph capture")

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(graph_calls):
            calls()
    torch.cuda.synchronize()
    for replay in range(2):
        stage(f"graph replay {replay + 1}")
        fill()
        graph.replay()
        torch.cuda.synchronize()
        verdicts += verify(f"graph replay {replay + 1}")
    del graph
    ok = all(v["ok"] for v in verdicts)
    return {"status": "pass" if ok else "fail",
            "failure": None if ok else "wrong result",
            "checks": verdicts}


def run_tests(rk: Rank, cases: list[Case]) -> None:
    for case in cases:
        say("START", case.key)
        record: dict[str, Any] = {"key": case.key, "rank": rk.rank}
        reason = skip_reason(case, rk.capability)
        if reason:
            record.update(status="skip", reason=reason)
            say("RESULT", record)
            continue
        try:
            record.update(run_case(rk, case))
        except Exception as exc:
            record.update(status="fail", failure="error",
                          reason=f"{type(exc).__name__}: {exc}"[:2000],
                          traceback=traceback.format_exc()[-3000:])
            say("RESULT", record)
            if cuda_broken(exc):
                hard_exit(EXIT_CUDA_ERROR)
            rk.barrier()
            continue
        say("RESULT", record)
        rk.barrier()


# ---- benchmark -------------------------------------------------------------------------
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


# ---- compile / probe -------------------------------------------------------------------
def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "gpu_count": torch.cuda.device_count(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "capability": list(torch.cuda.get_device_capability(0))
        if torch.cuda.device_count() else None,
    }
    try:
        import flashinfer  # type: ignore[import-not-found, unused-ignore]

        env["flashinfer"] = flashinfer.__version__
        env["flashinfer_path"] = str(Path(flashinfer.__file__).parent)
        from flashinfer import _build_meta  # type: ignore[import-not-found, unused-ignore]

        env["flashinfer_git"] = getattr(_build_meta, "__git_version__", None)
    except Exception as exc:
        env["flashinfer_error"] = f"{type(exc).__name__}: {exc}"
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found, unused-ignore]

        driver.cuInit(0)
        _err, version = driver.cuDriverGetVersion()
        env["driver_cuda_api"] = version
        attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
        _err, mc = driver.cuDeviceGetAttribute(attr, 0)  # a query only: creates nothing
        env["multicast_supported_attr"] = int(mc)
    except Exception as exc:
        env["driver_query_error"] = f"{type(exc).__name__}: {exc}"
    return env


def run_compile(modules: list[str]) -> None:
    say("ENV", environment())
    if "comm" in modules:
        from flashinfer.comm.trtllm_ar import (  # type: ignore[import-not-found, unused-ignore]
            get_trtllm_comm_module,
        )

        get_trtllm_comm_module()
        print("compiled/loaded trtllm comm module", flush=True)
    if "norm" in modules:
        from flashinfer.norm import fused_add_rmsnorm  # type: ignore[import-not-found, unused-ignore]

        x = torch.randn(2, 256, device="cuda", dtype=torch.bfloat16)
        fused_add_rmsnorm(x, torch.randn_like(x), torch.ones(256, device="cuda",
                                                             dtype=torch.bfloat16))
        torch.cuda.synchronize()
        print("compiled/loaded norm module", flush=True)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    mode = spec["mode"]
    if mode == "compile":
        run_compile(list(spec.get("modules", ["comm"])))
        say("DONE")
        return 0
    rank = int(argv[1])
    rk = Rank(spec, rank)
    if rank == 0:
        say("ENV", {**environment(), "shared": rk.shared, "world_size": rk.world})
    if mode == "test":
        run_tests(rk, [Case.from_dict(c) for c in spec["cases"]])
    elif mode == "bench":
        run_bench(rk, BenchPlan.from_dict(spec["bench"]))
    else:
        raise ValueError(f"unknown mode {mode}")
    rk.barrier()
    say("DONE")
    hard_exit(0)
    return 0


if __name__ == "__main__":
    try:
        hard_exit(main(sys.argv[1:]))
    except Exception:
        traceback.print_exc()
        hard_exit(1)
