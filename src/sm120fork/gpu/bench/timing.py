"""The bench inside a rank, ``python -m sm120fork.gpu.bench.timing SPEC RANK``: every method
of :data:`sm120fork.gpu.methods.METHODS` through its :class:`Adapter`, driven the same way
(:func:`drive`): one that cannot run here says why and is not runnable, one whose output
does not match the fp32 reference is reported with its failing check and never timed, the
rest are timed in CUDA-graph replays; and the floors.  FlashInfer and torch are untyped."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib
import os
import statistics
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sm120fork.gpu.core import worker
from sm120fork.gpu.core.cases import NCCL_SHARED, BenchPlan, Case, RankSpec
from sm120fork.gpu.core.documents import BenchRecord, CheckVerdict
from sm120fork.gpu.core.reference import RMS_EPS, TORCH_DTYPES, compare, expected, generate
from sm120fork.gpu.core.worker import Rank, capture_graph, cuda_broken, say
from sm120fork.gpu.methods import ERROR, FAILED_CHECK, METHODS, NOT_RUNNABLE, STARTING, TIMED
from sm120fork.util import typed


@dataclasses.dataclass(frozen=True)
class Point:
    tokens: int
    hidden: int


#: (x, residual, residual_out, norm_out) of one rotating buffer set
BufferSet = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class Adapter:
    """Base: in-place ``fused_add_rmsnorm`` after an all-reduce into ``residual_out``;
    ``unbuilt``: why the method's module failed in the module step (not retried)."""

    #: where (residual sum, normed output) land in a buffer set
    OUTPUTS = (1, 2)

    def __init__(self, rk: Rank, name: str = "", unbuilt: str | None = None) -> None:
        self.rk, self.name, self.unbuilt = rk, name, unbuilt
        self.bufs: list[BufferSet] = []
        self.gamma: torch.Tensor | None = None

    def max_bytes(self) -> int:
        """The largest bf16 message of the run."""
        return int(self.rk.spec["max_tokens"]) * int(self.rk.spec["max_hidden"]) * 2

    def unavailable(self) -> str | None:
        return self.unbuilt

    def unsupported(self, point: Point) -> str | None:
        return None

    def bind(self, bufs: list[BufferSet], gamma: torch.Tensor, point: Point) -> None:
        self.bufs, self.gamma = bufs, gamma

    def reduce(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """The method's all-reduce of ``x``: into ``out``, or in place."""
        raise NotImplementedError

    def op(self, i: int) -> Callable[[], None]:
        """:meth:`reduce` on set ``i``, then ``fused_add_rmsnorm`` in place on the sum."""
        from flashinfer.norm import fused_add_rmsnorm  # type: ignore[import-not-found, unused-ignore]

        x, res, r_out, _n = self.bufs[i]
        summed, gamma = self.bufs[i][self.OUTPUTS[1]], self.gamma

        def run() -> None:
            self.reduce(x, r_out)
            fused_add_rmsnorm(summed, res, gamma, RMS_EPS)
        return run

    def outputs(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual sum, normed output) after ``op(i)``."""
        return self.bufs[i][self.OUTPUTS[0]], self.bufs[i][self.OUTPUTS[1]]

    def after_capture(self) -> None:
        """On every rank after each CUDA-graph capture of this method's ops."""


class Nccl(Adapter):
    """NCCL all-reduce in place, then ``fused_add_rmsnorm``; NCCL's own tuning env."""

    OUTPUTS = (1, 0)
    group: Any = None

    def unavailable(self) -> str | None:
        if self.rk.shared:
            return NCCL_SHARED
        off = {k: v for k, v in METHODS[self.name].env.items() if os.environ.get(k) != v}
        if off:
            return f"this rank group was not started with {off} (launcher error)"
        self.group = dist.new_group(list(range(self.rk.world)), backend="nccl")
        return None

    def reduce(self, x: torch.Tensor, out: torch.Tensor) -> None:
        dist.all_reduce(x, group=self.group)


class Fused(Adapter):
    """Our fused kernel through FlashInfer's unified API (legacy API if that fails)."""

    OUTPUTS = (2, 3)
    ws: Any = None
    api = "fusion_unified"

    def __init__(self, rk: Rank, name: str, oneshot: bool | None) -> None:
        super().__init__(rk, name)
        self.oneshot = oneshot

    def unavailable(self) -> str | None:
        try:
            self.ws = self.rk.workspace(self.api)
        except Exception as exc:
            if cuda_broken(exc):
                raise
            self.api = "fusion_legacy"
            self.ws = self.rk.workspace(self.api)
        return None

    def unsupported(self, point: Point) -> str | None:
        if self.oneshot is False and point.tokens <= self.rk.world:
            return "two-shot needs more tokens than ranks (FlashInfer asserts it)"
        return None

    def op(self, i: int) -> Callable[[], None]:
        rk, xin, (res, r_out, n_out) = self.rk, self.bufs[i][0], self.bufs[i][1:]
        common = {"launch_with_pdl": True, "rms_gamma": self.gamma, "rms_eps": RMS_EPS,
                  "use_oneshot": self.oneshot}
        if self.api == "fusion_unified":
            return functools.partial(
                rk.fc.allreduce_fusion, input=xin, workspace=self.ws, pattern=1,
                residual_out=r_out, norm_out=n_out, residual_in=res, **common)
        return functools.partial(
            rk.fc.trtllm_allreduce_fusion, allreduce_in=xin.view(-1), world_size=rk.world,
            world_rank=rk.rank, token_num=xin.shape[0], hidden_dim=xin.shape[1],
            workspace_ptrs=self.ws["tensor"], trigger_completion_at_end=True, fp32_acc=False,
            pattern_code=1, allreduce_out=None, residual_in=res.view(-1),
            residual_out=r_out.view(-1), norm_out=n_out.view(-1), quant_out=None,
            scale_out=None, scale_factor=None, layout_code=None,
            metadata=self.ws["metadata"], **common)


class PcieIpc(Adapter):
    """FlashInfer's ``PcieIpcAllReduceWorkspace`` (0.7.x), then ``fused_add_rmsnorm``."""

    ws: Any = None

    def unavailable(self) -> str | None:
        try:
            from flashinfer.comm import (  # type: ignore[import-not-found, unused-ignore]
                PcieIpcAllReduceWorkspace,
            )
        except ImportError:
            version = getattr(sys.modules.get("flashinfer"), "__version__", "?")
            return (f"FlashInfer {version} has no pcie_ipc all-reduce "
                    "(FlashInfer 0.7.x has it)")
        if self.rk.world not in (2, 4, 8):
            return "pcie_ipc supports world sizes 2, 4 and 8"
        # Every rank passes the same arguments (the constructor is collective).  On a
        # shared GPU the topology probe has nothing to find: name the profile.
        self.ws = PcieIpcAllReduceWorkspace(
            group=dist.group.WORLD,
            max_numel=self.max_bytes() // 2,
            dtype=torch.bfloat16, profile="rootcplx" if self.rk.shared else None,
            tune_cache=str(Path(self.rk.spec["store"]).with_name("pcie_ipc_tune.json")))
        return None

    def unsupported(self, point: Point) -> str | None:
        probe = torch.empty((point.tokens, point.hidden), dtype=torch.bfloat16,
                            device=self.rk.device)
        return None if self.ws.supports(probe) else "pcie_ipc does not support this shape"

    def bind(self, bufs: list[BufferSet], gamma: torch.Tensor, point: Point) -> None:
        super().bind(bufs, gamma, point)
        # resolve the launch configuration now, collectively: a capture cannot
        self.ws.prepare([(point.tokens, point.hidden)], dtype=torch.bfloat16)

    def reduce(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self.ws.all_reduce(x, out=out)


#: The custom all-reduce's functions (FlashInfer names them ``vllm_<name>``).
CUSTOM_OPS = ("init_custom_ar", "register_buffer", "all_reduce", "meta_size",
              "get_graph_buffer_ipc_meta", "register_graph_buffers")


class CustomAllReduce(Adapter):
    """The vLLM-style custom all-reduce (FlashInfer's copy, or SGLang's), its functions
    ``prefix<name>`` of ``module``: eagerly staged into a registered IPC buffer; captured
    inputs registered by ``after_capture``.  ``full_nvlink`` is False (PCIe: FlashInfer's
    copy runs only at two ranks)."""

    MAX_CTAS = 36  # the kernel's upper bound
    ops: Any = None
    fa: Any = None

    def __init__(self, rk: Rank, name: str, module: str, prefix: str = "") -> None:
        super().__init__(rk, name)
        self.module, self.prefix = module, prefix

    def unavailable(self) -> str | None:
        try:
            found = importlib.import_module(self.module)
            self.ops = types.SimpleNamespace(**{n: getattr(found, self.prefix + n)
                                                for n in CUSTOM_OPS})
        except (ImportError, AttributeError) as exc:
            return f"{self.module} does not serve the custom all-reduce here: {exc}"
        if self.rk.world not in (2, 4, 6, 8):
            return "the custom all-reduce supports 2, 4, 6 or 8 ranks"
        fc, rk = self.rk.fc, self.rk
        self.size = self.max_bytes()
        meta_bytes = int(self.ops.meta_size()) + self.size
        meta = fc.create_shared_buffer(meta_bytes, None)
        fc.cuda_ipc.cudart.cudaMemset(ctypes.c_void_p(meta[rk.rank]), 0, meta_bytes)
        torch.cuda.synchronize()
        rk.barrier()
        self.rank_data = torch.empty(8 * 1024 * 1024, dtype=torch.uint8, device=rk.device)
        self.buffer_ptrs = fc.create_shared_buffer(self.size, None)
        self.fa = self.ops.init_custom_ar(meta, self.rank_data, rk.rank, False)
        self.ops.register_buffer(self.fa, self.buffer_ptrs)
        rk.barrier()
        return None

    def reduce(self, x: torch.Tensor, out: torch.Tensor) -> None:
        if torch.cuda.is_current_stream_capturing():
            # captured: the kernel reads the input itself (recorded for
            # after_capture to register), as vLLM does under graphs
            self.ops.all_reduce(self.fa, x, out, 0, 0, self.MAX_CTAS)
        else:  # eager: staged into the registered buffer
            self.ops.all_reduce(self.fa, x, out, self.buffer_ptrs[self.rk.rank], self.size,
                                self.MAX_CTAS)

    def after_capture(self) -> None:
        handles, offsets = self.ops.get_graph_buffer_ipc_meta(self.fa)
        every: list[Any] = [None] * self.rk.world
        dist.all_gather_object(every, (list(handles), list(offsets)))
        self.ops.register_graph_buffers(self.fa, [h for h, _ in every],
                                        [o for _, o in every])


class B12x(Adapter):
    """b12x's PCIe one-shot all-reduce with the residual add and RMSNorm fused (SM12x)."""

    OUTPUTS = (2, 3)
    MAX_FUSED_TOKENS = 36  # b12x fuses the norm only up to this many rows
    runtime: Any = None
    plans: list[Any]

    def unavailable(self) -> str | None:
        major, minor = self.rk.capability
        if major != 12:
            return f"b12x runs on SM12x only; this GPU is sm_{major}{minor}"
        try:
            from b12x.comm import pcie  # type: ignore[import-not-found, unused-ignore]
        except ImportError as exc:
            return f"b12x does not import here: {exc}"
        max_bytes = self.max_bytes()
        self.runtime = pcie.AllReduce.from_exchange_group(
            exchange_group=dist.group.WORLD, device=self.rk.device,
            eager_buffer_bytes=max_bytes, max_size=max_bytes)
        return None

    def unsupported(self, point: Point) -> str | None:
        if point.tokens > self.MAX_FUSED_TOKENS:
            return f"b12x fuses the norm only up to {self.MAX_FUSED_TOKENS} tokens"
        return None

    def bind(self, bufs: list[BufferSet], gamma: torch.Tensor, point: Point) -> None:
        super().bind(bufs, gamma, point)
        self.plans = [self.runtime.plan(b[0], operation="all_reduce_fused_add_rms_norm")
                      for b in bufs]

    def op(self, i: int) -> Callable[[], None]:
        x, res, r_out, n_out = self.bufs[i]
        return functools.partial(self.runtime.all_reduce_fused_add_rms_norm, x, res,
                                 self.gamma, RMS_EPS, plan=self.plans[i], out=n_out,
                                 residual_out=r_out)


#: method name -> adapter factory; the registry's keys and these must agree (tested)
FACTORIES: dict[str, Callable[[Rank], Adapter]] = {
    name: functools.partial(cls, name=name, **kw) for name, cls, kw in (
        ("nccl_rmsnorm", Nccl, {}),
        ("nccl_tuned_rmsnorm", Nccl, {}),
        ("fused_oneshot", Fused, {"oneshot": True}),
        ("fused_twoshot", Fused, {"oneshot": False}),
        ("fused_auto", Fused, {"oneshot": None}),
        ("pcie_ipc_rmsnorm", PcieIpc, {}),
        ("custom_vllm_rmsnorm", CustomAllReduce,
         {"module": "flashinfer.comm", "prefix": "vllm_"}),
        ("custom_sglang_rmsnorm", CustomAllReduce, {"module": "sgl_kernel.allreduce"}),
        ("b12x_fused", B12x, {}),
    )}


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


def agree(reasons: Sequence[str | None]) -> str | None:
    """One verdict for the group from every rank's: a method runs only if it runs on all."""
    bad = [(rank, r) for rank, r in enumerate(reasons) if r]
    if not bad:
        return None
    rank, reason = bad[0]
    return reason if len(bad) == len(reasons) else f"rank {rank}: {reason}"


def drive(adapters: Sequence[Any], points: Sequence[Point], *,
          check: Callable[[Any, Point], tuple[bool, list[CheckVerdict]]],
          time: Callable[[Any, Point], BenchRecord], emit: Callable[[BenchRecord], None],
          gather: Callable[[Any], list[Any]] = lambda x: [x],
          is_fatal: Callable[[BaseException], bool] = lambda _exc: False) -> None:
    """Check, then time, every runnable method at every point; report the others.  Method
    by method: the ``starting`` record of one that kills the ranks tells the launcher which
    to skip when it resumes.  ``gather`` (one value from every rank) makes every rank take
    the same branch; ``is_fatal`` errors (a poisoned CUDA context) propagate."""
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


def run(rank: Rank, spec: object) -> None:
    read = typed.read(RankSpec, spec, "the bench spec", strict=False)
    assert read.bench is not None  # the bench's launcher always gives it
    measure(rank, read.bench, list(read.methods))


if __name__ == "__main__":
    worker.serve({"bench": run})
