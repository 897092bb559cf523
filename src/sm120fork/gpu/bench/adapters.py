"""The bench's methods inside a rank: one adapter per :data:`sm120fork.gpu.methods.METHODS`
entry (can it run here, for which shapes, its op on buffer set ``i``, where its outputs
land).  FlashInfer and torch are untyped here."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sm120fork.gpu.core.cases import NCCL_SHARED
from sm120fork.gpu.core.rank import Rank, cuda_broken
from sm120fork.gpu.core.reference import RMS_EPS
from sm120fork.gpu.methods import METHODS


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
