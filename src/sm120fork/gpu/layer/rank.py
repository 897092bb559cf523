"""One rank of SGLang's fused-norm layer path: ``python -m sm120fork.gpu.layer.rank
'<RankRequest as JSON>'``, the tree under test first on ``PYTHONPATH``.

Replaced, and nothing else: SGLang's TP group (gloo; NCCL refuses two ranks on one GPU),
its capability query (12.0 to callers in ``sglang.*`` only), on a GPU ``sgl_kernel``, and
on the CPU what ``harness.fake_gpu`` fakes plus a FlashInfer stand-in that makes the same
collectives as FlashInfer's trtllm backend.  Imports only stdlib-only parts of
``sm120fork``; says ``READY``, then one ``RESULT`` or one ``RAISED``.
"""

from __future__ import annotations

import array
import dataclasses
import datetime as dt
import itertools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar
from unittest import mock

from sm120fork.harness import fake_gpu
from sm120fork.harness.fake_gpu import _module
from sm120fork.layouts import FUSION_MODULE, Layer, Observation, Raised, Step
from sm120fork.layouts import adapter as layout_adapter
from sm120fork.util import typed, wire

READY, RESULT, RAISED = "READY", "RESULT", "RAISED"
#: The fusion module's bounds (S4, G6) the request sets where the tree has them.
AGREEMENT_TIMEOUT = "_FUSED_CALL_AGREEMENT_TIMEOUT_S"
EXCHANGE_TIMEOUT = "_HANDLE_EXCHANGE_TIMEOUT_S"
STUBBED_CAPABILITY = (12, 0)
#: Compiled for another torch: import stubs on a GPU.
GPU_STUBS = ("sgl_kernel",)
DEFAULT_TOKENS = (1, 3, 16, 64, 128)
EPS = 1e-6

#: case -> (what is injected, on which ranks: "all", a rank number, or None), in run order.
CASES: dict[str, tuple[str | None, str | int | None]] = {
    "fused": (None, None),
    "all-ranks-create-fails": ("create-raises", "all"),
    "one-rank-create-fails": ("create-raises", 1),
    "one-rank-fails-midway": ("second-buffer-raises", 1),
    "one-rank-fails-late": ("create-returns-then-raises", 1),
    "fused-call-raises": ("fused-call-raises", "all"),
    "no-p2p": ("no-p2p", "all"),
    "one-rank-fails-in-fd-exchange": ("fd-exchange-raises", 1),
    "one-rank-fused-call-raises": ("fused-call-raises", 1),
    "rank-0-fused-call-raises": ("fused-call-raises", 0),
    "policy-eager": (None, None),
    "policy-graph": (None, None),
}
POLICY_CASES = ("policy-eager", "policy-graph")
#: Cases a GPU run leaves out: they run on the CPU only.
CPU_ONLY_CASES = ("no-p2p", "one-rank-fails-in-fd-exchange")
POLICY_ENV = "SGLANG_SM120_ALLREDUCE_POLICY"
PCIE_IPC_MODULE = "sglang.srt.distributed.device_communicators.pcie_ipc_ar"
#: Rows the pcie_ipc workspace is built for (the policy cases' widest step).
PCIE_IPC_ROWS = 64
#: Why a step of the graph case whose route is SGLang's unfused dispatch is not captured.
NOT_CAPTURABLE = ("not captured: SGLang's unfused dispatch all-reduces through the "
                  "harness's gloo group here (NCCL refuses two ranks on one GPU), which a "
                  "CUDA graph cannot record; its route was taken and checked eagerly")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankRequest:
    rank: int
    world_size: int
    case: str
    layout: str
    init_method: str
    device: str = "cuda"
    collective_timeout_s: float = 120.0
    gates_in_memory: bool = False
    load_plugins: bool = False
    #: AGREEMENT_TIMEOUT and EXCHANGE_TIMEOUT (None: the tree's own)
    fused_call_agreement_timeout_s: float | None = None
    handle_exchange_timeout_s: float | None = None
    tokens: tuple[int, ...] = DEFAULT_TOKENS
    policy_path: str | None = None


#: "at": when the injected fused-call error was raised here (monotonic).
_FUSED_CALL_RAISED: dict[str, float] = {}


class _WorldBackend:
    """FlashInfer's ``TorchDistBackend`` over the group SGLang passed (or the default)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def allgather(self, data: Any) -> list[Any]:
        dist = _module("torch.distributed")
        out: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(out, data, group=self.group)
        return out

    def barrier(self) -> None:
        _module("torch.distributed").barrier(group=self.group)

    def bcast(self, data: Any, root: int) -> Any:
        return self.allgather(data)[root]

    def Get_rank(self) -> int:  # noqa: N802 - FlashInfer's CommBackend names
        return int(_module("torch.distributed").get_rank(self.group))

    def Get_size(self) -> int:  # noqa: N802
        return int(_module("torch.distributed").get_world_size(self.group))


class GlooTPGroup(_WorldBackend):
    """SGLang's group coordinator as the layer path uses it, over the default (CPU) group;
    its device group is a second gloo group, so a collective on the wrong group waits as
    it would on a GPU."""

    def __init__(self, rank: int, world_size: int) -> None:
        dist = _module("torch.distributed")
        super().__init__(dist.group.WORLD)
        self.rank = self.rank_in_group = self.local_rank = rank
        self.world_size = world_size
        self.ranks = list(range(world_size))
        self.first_rank, self.last_rank = 0, world_size - 1
        self.unique_name = "tp:0"
        self.cpu_group = self.group
        self.device_group = dist.new_group(backend="gloo")
        self.all_reduce_calls = 0
        self.pcie_ipc_comm: Any = None
        self.ca_comm = self.qr_comm = self.pymscclpp_comm = None
        self.torch_symm_mem_comm = self.pynccl_comm = None

    all_gather_object = _WorldBackend.allgather

    def attach_pcie_ipc(self, device: Any) -> bool:
        """SGLang's pcie_ipc communicator, where its own ``eligible_group`` builds one."""
        pcie = _module(PCIE_IPC_MODULE)
        if pcie.eligible_group(group_name="tp", world_size=self.world_size,
                               deterministic=False):
            self.pcie_ipc_comm = pcie.PcieIpcCommunicator(
                group=self.device_group, device=device, cpu_group=self.cpu_group)
        return self.pcie_ipc_comm is not None

    def all_reduce(self, input_: Any) -> Any:
        """SGLang's own method choice where pcie_ipc exists; else NCCL's stand-in."""
        if self.pcie_ipc_comm is not None:
            coordinator = _module("sglang.srt.distributed.parallel_state").GroupCoordinator
            if coordinator._resolve_outplace_all_reduce_method(self, input_) == "pcie_ipc":
                return self.pcie_ipc_comm.pcie_ipc_all_reduce(input_)
        self.all_reduce_calls += 1
        total = _summed(input_.detach().cpu().contiguous(), self.cpu_group)
        return total.to(device=input_.device, dtype=input_.dtype)


class _FakeBuffer:
    alive = 0

    def __init__(self) -> None:
        _FakeBuffer.alive += 1

    def __del__(self) -> None:
        _FakeBuffer.alive -= 1


@dataclasses.dataclass(eq=False)  # compared and hashed by identity
class _FakeWorkspace:
    buffers: list[_FakeBuffer]
    group: Any
    metadata: dict[str, bool]
    destroyed: bool = False
    backend: ClassVar[str] = "trtllm"

    def is_buffer_size_sufficient(self, **_: Any) -> bool:
        return not self.destroyed

    def destroy(self) -> None:
        self.buffers = []
        self.destroyed = True


def _summed(tensor: Any, group: Any) -> Any:
    """``tensor`` summed over ``group`` in float32 (the stand-ins' all-reduce)."""
    total = tensor.float().clone()
    _module("torch.distributed").all_reduce(total, group=group)
    return total


#: A failing rank's socket stays open (FlashInfer's half-built buffer holds it), so a
#: peer's send still lands and the peer waits in its receive.
_KEPT_OPEN: list[socket.socket] = []


def _posix_fd_allgather(backend: Any, fd: int, fail_at: int | None) -> list[int]:
    """FlashInfer 0.6.7's ``PosixFDHandleExchanger``: per peer a barrier, then ``fd`` sent
    over an AF_UNIX socket and a blocking receive; ``fail_at`` raises after a barrier."""
    rank, size = backend.Get_rank(), backend.Get_size()
    name = f"\0sm120fork-fd-{backend.bcast(os.urandom(8).hex() if rank == 0 else None, 0)}-"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(name + str(rank))
    received: list[int] = []
    try:
        for step in range(size):
            backend.barrier()
            if step == fail_at:
                _KEPT_OPEN.append(sock.dup())
                raise RuntimeError("CUDA_ERROR_INVALID_HANDLE (injected inside the "
                                   "POSIX-fd handle exchange, after its barrier)")
            # not socket.send_fds: Python 3.11's drops its address argument
            sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [fd]))], 0, name + str((rank + step) % size))
            received += socket.recv_fds(sock, 1, 1)[1]
    finally:
        sock.close()
        for other in received:
            os.close(other)
    return received


@dataclasses.dataclass(eq=False)  # compared and hashed by identity
class FakeFlashInferComm:
    """``flashinfer.comm`` on the CPU: per buffer an allocation and a handle exchange, then
    a barrier; it makes the second-buffer and fd-exchange faults itself."""

    #: FlashInfer's POSIX-fd handle exchange, on every rank (it picks it per machine)
    posix_fd_exchange: bool = False
    #: this rank's injected fault
    fault: str | None = None
    allocations: int = 0

    class AllReduceFusionPattern:
        kARResidualRMSNorm = 1  # noqa: N815 - FlashInfer's name

    def create_allreduce_fusion_workspace(self, *, comm_backend: Any = None,
                                          use_fp32_lamport: bool = False,
                                          group: Any = None, **_: Any) -> _FakeWorkspace:
        backend = comm_backend if comm_backend is not None else _WorldBackend(group)
        buffers = []
        for _index in range(3):
            self.allocations += 1
            if self.fault == "second-buffer-raises" and self.allocations == 2:
                raise RuntimeError(
                    "CUDA_ERROR_OUT_OF_MEMORY: out of memory (injected at allocation "
                    f"{self.allocations})")
            buffer = _FakeBuffer()
            buffers.append(buffer)
            if self.posix_fd_exchange:
                with open(os.devnull) as handle:  # the exported handle: a real fd
                    _posix_fd_allgather(backend, handle.fileno(),
                                        1 if self.fault == "fd-exchange-raises" else None)
            else:
                backend.allgather(id(buffer))
        backend.barrier()
        return _FakeWorkspace(buffers, group, {"use_fp32_lamport": use_fp32_lamport})

    def allreduce_fusion(self, *, input: Any, residual_in: Any, rms_gamma: Any,
                         rms_eps: float, norm_out: Any, residual_out: Any,
                         workspace: Any = None, **_: Any) -> None:
        torch = _module("torch")
        hidden = _summed(input, getattr(workspace, "group", None)) + residual_in.float()
        variance = hidden.pow(2).mean(dim=-1, keepdim=True)
        norm_out.copy_(hidden * torch.rsqrt(variance + rms_eps) * rms_gamma.float())
        residual_out.copy_(hidden)


class FakePcieIpcWorkspace:
    """FlashInfer's ``PcieIpcAllReduceWorkspace`` on the CPU, summing over its gloo group."""

    def __init__(self, *, group: Any, max_numel: int, **_: Any) -> None:
        self.group, self.max_numel = group, max_numel

    def supports(self, inp: Any) -> bool:
        return bool(inp.numel() <= self.max_numel)

    def destroy(self) -> None:
        """Nothing to free, nor a stream to rebind, on the CPU."""

    rebind_stream = destroy

    def tune(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def all_reduce(self, inp: Any) -> Any:
        return _summed(inp, self.group).to(inp.dtype)


class RouteSpy:
    """Which all-reduce ran: the fused call, SGLang's pcie_ipc entry or the plain one."""

    def __init__(self, group: GlooTPGroup) -> None:
        self.group = group
        self.calls = {"fused": 0, "pcie_ipc": 0}
        self._mark = self._now()

    def wrap(self, holder: Any, attr: str, route: str) -> None:
        real = getattr(holder, attr)

        def spied(*args: Any, **kwargs: Any) -> Any:
            self.calls[route] += 1
            return real(*args, **kwargs)

        setattr(holder, attr, spied)

    def _now(self) -> dict[str, int]:
        return {**self.calls, "sglang_dispatch": self.group.all_reduce_calls}

    def start(self) -> None:
        self._mark = self._now()

    def route(self) -> str:
        ran = {route: n - self._mark[route] for route, n in self._now().items()}
        named = [route for route, n in ran.items() if n]
        return named[0] if len(named) == 1 else (
            f"mixed (trtllm_allreduce_fusion {ran['fused']}, pcie_ipc {ran['pcie_ipc']}, "
            f"plain all-reduce {ran['sglang_dispatch']})")


class _Norm:
    """SGLang's RMSNorm at the model's width on this rank, and its float32 reference."""

    def __init__(self, req: RankRequest, layer: Layer) -> None:
        torch = _module("torch")
        self.rank, self.world, self.cuda = req.rank, req.world_size, req.device == "cuda"
        self.dev = torch.device("cuda" if self.cuda else "cpu")
        # pcie_ipc all-reduces bf16 only: the policy cases run bf16 on the CPU too
        self.dtype = torch.bfloat16 if self.cuda or req.case in POLICY_CASES else torch.float32
        self.tolerance = 1e-5 if self.dtype == torch.float32 else 2e-2
        self.hidden = 7168 if self.cuda else 256
        # The model's dtype: FlashInfer's fused kernel reads gamma in the input's dtype.
        self.norm = layer.layernorm.RMSNorm(self.hidden, eps=EPS).to(device=self.dev,
                                                                      dtype=self.dtype)
        self.weight = torch.rand(self.hidden,
                                 generator=torch.Generator().manual_seed(7168)) + 0.5
        with torch.no_grad():
            self.norm.weight.copy_(self.weight.to(self.dtype))
        self.norm._forward_method = self.norm.forward_native  # sgl_kernel is not loaded here

    def inputs(self, tokens: int, seed: int = 0) -> tuple[list[Any], Any, Any, Any]:
        torch = _module("torch")

        def randn(seed: int) -> Any:
            generator = torch.Generator().manual_seed(seed)
            return torch.randn(tokens, self.hidden, generator=generator).to(self.dtype)

        xs = [randn(seed + 1000 * r + tokens) for r in range(self.world)]
        residual = randn(seed + tokens)
        return xs, residual, xs[self.rank].to(self.dev).clone(), residual.to(self.dev).clone()

    def step(self, tokens: int, path: str, out: Any, res: Any, xs: list[Any], residual: Any,
             **more: Any) -> Step:
        torch = _module("torch")
        if self.cuda:
            torch.cuda.synchronize()
        hidden = torch.stack([x.float() for x in xs]).sum(dim=0) + residual.float()
        variance = hidden.pow(2).mean(dim=-1, keepdim=True)
        want = hidden * torch.rsqrt(variance + EPS) * self.weight.to(self.dtype).float()
        err_out, err_res = _relative_error(out, want), _relative_error(res, hidden)
        return Step(tokens=tokens, path=path, norm_error=err_out, residual_error=err_res,
                    correct=err_out <= self.tolerance and err_res <= self.tolerance, **more)


def _relative_error(got: Any, want: Any) -> float:
    scale = float(want.abs().max()) or 1.0
    return float((got.float().cpu() - want).abs().max()) / scale


def fault_steps(layer: Layer, m: _Norm, group: GlooTPGroup,
                tokens_list: Sequence[int]) -> list[Step]:
    """The norm at each token count: fused where the gate says so, else all-reduce + norm."""
    steps = []
    for tokens in tokens_list:
        xs, residual, x_in, r_in = m.inputs(tokens)
        gate = bool(layer.gate(tokens))
        calls = group.all_reduce_calls
        with _module("torch").no_grad():
            if gate:
                out, res = m.norm.forward_with_allreduce_fusion(x_in, r_in)
            else:
                out, res = m.norm.forward(group.all_reduce(x_in), r_in)
        reduced = group.all_reduce_calls > calls
        path = "unfused" if not gate else ("fallback" if reduced else "fused")
        steps.append(m.step(tokens, path, out, res, xs, residual, gate=gate))
    return steps


def policy_steps(layer: Layer, m: _Norm, group: GlooTPGroup, spy: RouteSpy,
                 tokens_list: Sequence[int], *, graph: bool) -> list[Step]:
    """SGLang's ``fused_ffn_input``, else its unfused completion, at each token count;
    ``graph``: captured after one eager warm-up and replayed on new inputs."""
    torch = _module("torch")
    fusions = _module("sglang.srt.layers.layer_boundary.fusions.allreduce")
    comm_op = _module("sglang.srt.distributed.communication_op")
    plan = type("Plan", (), {"norm": m.norm, "fusions": None})()

    def run(x: Any, r: Any) -> tuple[Any, Any]:
        spy.start()
        with _module("torch").no_grad():
            fused = fusions.fused_ffn_input(plan, x, r, None)
            if fused is not None:
                return tuple(fused)
            return tuple(m.norm.forward(
                comm_op.attention_tensor_model_parallel_all_reduce(x), r))

    steps = []
    for tokens in tokens_list:
        xs, residual, x_in, r_in = m.inputs(tokens)
        out, res = run(x_in, r_in)
        step = m.step(tokens, spy.route(), out, res, xs, residual, graph=graph)
        if graph and m.cuda and step.path == "sglang_dispatch":
            step = dataclasses.replace(step, skipped=NOT_CAPTURABLE)
        elif graph and m.cuda:
            _, _, x_in, r_in = m.inputs(tokens)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                out, res = run(x_in, r_in)
            captured = spy.route()
            xs, residual, x_new, r_new = m.inputs(tokens, seed=7)
            x_in.copy_(x_new)
            r_in.copy_(r_new)
            cuda_graph.replay()
            step = m.step(tokens, captured, out, res, xs, residual, graph=graph)
            del cuda_graph
        elif graph:  # the CPU stand-in: SGLang's side sees a capture in progress
            with mock.patch.object(torch.cuda, "is_current_stream_capturing",
                                   return_value=True):
                xs, residual, x_in, r_in = m.inputs(tokens)
                out, res = run(x_in, r_in)
                step = m.step(tokens, spy.route(), out, res, xs, residual, graph=graph)
        steps.append(dataclasses.replace(step, route=step.path))
    return steps


def _raising(holder: Any, attr: str, error: Callable[[], Exception], *,
             only_call: int | None = None, real_first: bool = False) -> None:
    """``holder.attr`` raising ``error()`` (at call ``only_call`` only; after the real
    call returned, ``real_first``)."""
    real, calls = getattr(holder, attr), itertools.count(1)

    def call(*args: Any, **kwargs: Any) -> Any:
        if real_first:
            real(*args, **kwargs)
        if only_call in (None, next(calls)):
            raise error()
        return real(*args, **kwargs)

    setattr(holder, attr, call)


def _fused_call_error() -> Exception:
    _FUSED_CALL_RAISED["at"] = time.monotonic()
    return ValueError("injected host-side check failure in allreduce_fusion")


def _inject(layer: Layer, fault: str, *, fake: FakeFlashInferComm | None) -> None:
    """Put ``fault`` into the real call path of this rank (never into the code under test)."""
    fusion = layer.fusion
    holder, attr = fusion._flashinfer_comm, "create_allreduce_fusion_workspace"
    if getattr(fusion, "_create_allreduce_fusion_workspace", None) is not None:
        holder, attr = fusion, "_create_allreduce_fusion_workspace"  # 0.5.23 binds it
    if fault == "create-raises":
        _raising(holder, attr, lambda: RuntimeError(
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory (injected before workspace creation)"))
    elif fault == "create-returns-then-raises":
        _raising(holder, attr, lambda: RuntimeError(
            "cudaErrorLaunchFailure (injected after workspace creation)"), real_first=True)
    elif fault == "fused-call-raises":
        _raising(fusion._flashinfer_comm, "allreduce_fusion", _fused_call_error)
    elif fault == "no-p2p":
        _module("torch").cuda.can_device_access_peer = lambda device, peer: False
    elif fault == "second-buffer-raises" and fake is None:
        _raising(_module("flashinfer.comm.trtllm_ar"), "SymmDeviceMemory", lambda: RuntimeError(
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory (injected at the second workspace "
            "buffer)"), only_call=2)
    elif fault == "fd-exchange-raises" and fake is None:
        raise ValueError("fd-exchange-raises runs on the CPU (FlashInfer stand-in) only")


def _set_up_device(req: RankRequest) -> Any:
    """The CPU: the fake GPU, and SGLang's custom ops (the fused norm among them), which it
    registers for CUDA only, registered for the CPU too.  A GPU: its capability answers
    :data:`STUBBED_CAPABILITY` to callers in ``sglang.*`` only."""
    if req.device == "cpu":
        fake_gpu.fake_gpu(STUBBED_CAPABILITY)
        torch = _module("torch")
        torch.cuda.current_device = lambda: req.rank  # one GPU per rank, as SGLang runs
        library = _module("torch.library").Library
        real_impl = library.impl

        def impl(self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any,
                 **kwargs: Any) -> Any:
            result = real_impl(self, op_name, fn, dispatch_key, *args, **kwargs)
            if dispatch_key == "CUDA":
                real_impl(self, op_name, fn, "CPU", *args, **kwargs)
            return result

        library.impl = impl
        return torch
    torch = _module("torch")
    torch.cuda.set_device(0)
    _module("flashinfer.comm")  # FlashInfer reads the real GPU before the stub exists
    sys.meta_path.insert(0, fake_gpu._StubFinder(GPU_STUBS))
    real = torch.cuda.get_device_capability

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == "sglang" or caller.startswith("sglang."):
            return STUBBED_CAPABILITY
        return tuple(real(device))

    torch.cuda.get_device_capability = get_device_capability
    return torch


def _set_up_layer(req: RankRequest, group: GlooTPGroup, injected: str | None,
                  ) -> tuple[Layer, FakeFlashInferComm | None]:
    """The layout's layer over ``group``, bounds set, stand-in (CPU) and fault in place."""
    adapter = layout_adapter(req.layout)
    layer: Layer = adapter.setup(group)
    if req.gates_in_memory:
        adapter.patch_gates_in_memory(layer)
    for constant, bound in ((AGREEMENT_TIMEOUT, req.fused_call_agreement_timeout_s),
                            (EXCHANGE_TIMEOUT, req.handle_exchange_timeout_s)):
        if bound is not None and hasattr(layer.fusion, constant):  # stock has none
            setattr(layer.fusion, constant, float(bound))
    fake = None
    if req.device == "cpu":
        fake = FakeFlashInferComm(
            posix_fd_exchange=req.case == "one-rank-fails-in-fd-exchange", fault=injected)
        layer.fusion._flashinfer_comm = fake  # and what else the layout binds
        bind = getattr(adapter, "use_fake_flashinfer", None)
        if bind is not None:
            bind(layer.fusion, fake.create_allreduce_fusion_workspace)
    if injected is not None:
        _inject(layer, injected, fake=fake)
    return layer, fake


def run_rank(req: RankRequest) -> Observation:
    fault, where = CASES[req.case]
    injected = fault if fault is not None and where in ("all", req.rank) else None
    for name in [n for n in os.environ if n.startswith("SGLANG_")]:
        del os.environ[name]
    if req.policy_path is not None:  # where SGLang looks, in this rank as in every other
        os.environ[POLICY_ENV] = req.policy_path
    torch = _set_up_device(req)
    dist = _module("torch.distributed")
    dist.init_process_group(
        "gloo", init_method=req.init_method, rank=req.rank, world_size=req.world_size,
        timeout=dt.timedelta(seconds=req.collective_timeout_s))
    plugin = None
    if req.load_plugins:  # as every SGLang process does, before its work
        plugin = fake_gpu.Records("sm120fork.plugin", logging.INFO)
        _module("sglang.srt.plugins").load_plugins()
    group = GlooTPGroup(req.rank, req.world_size)
    layer, fake = _set_up_layer(req, group, injected)
    spy: RouteSpy | None = None
    pcie_ipc = False
    if req.case in POLICY_CASES:
        spy = RouteSpy(group)
        if fake is not None:  # the stand-in, and one current stream (SGLang's entry compares it)
            _module("flashinfer.comm").PcieIpcAllReduceWorkspace = FakePcieIpcWorkspace
            stream = object()
            torch.cuda.current_stream = lambda *args, **kwargs: stream
            spy.wrap(fake, "allreduce_fusion", "fused")
        else:
            for name in ("flashinfer.comm.allreduce", "flashinfer.comm"):
                module = _module(name)
                if hasattr(module, "trtllm_allreduce_fusion"):
                    spy.wrap(module, "trtllm_allreduce_fusion", "fused")
        spy.wrap(_module(PCIE_IPC_MODULE).PcieIpcCommunicator, "pcie_ipc_all_reduce", "pcie_ipc")
        pcie_ipc = group.attach_pcie_ipc(torch.device("cuda", 0))
    m = _Norm(req, layer)
    if pcie_ipc and m.cuda:  # before any step, as SGLang's runner does
        group.pcie_ipc_comm.prepare(hidden=m.hidden, max_rows=PCIE_IPC_ROWS)
    warnings = fake_gpu.Records(FUSION_MODULE, logging.WARNING)
    pcie_log = fake_gpu.Records(PCIE_IPC_MODULE, logging.INFO)  # what SGLang's pcie_ipc said
    dist.barrier()
    wire.say(READY)
    steps = (fault_steps(layer, m, group, req.tokens) if spy is None else
             policy_steps(layer, m, group, spy, req.tokens, graph=req.case == "policy-graph"))
    observation = Observation(
        rank=req.rank, layout=layer.layout, injected=injected,
        gate_after=bool(layer.gate(req.tokens[0])),
        unavailable=bool(layer.fusion.is_flashinfer_allreduce_unavailable()),
        warnings=tuple(warnings.lines), plugin=tuple(plugin.lines) if plugin else (),
        steps=tuple(steps), pcie_ipc_built=pcie_ipc, pcie_ipc_log=tuple(pcie_log.lines[-8:]),
        fake_buffers_alive=_FakeBuffer.alive if fake is not None else None)
    dist.barrier()
    dist.destroy_process_group()
    return observation


def main(argv: Sequence[str]) -> int:
    request = typed.read(RankRequest, json.loads(argv[0]), "the rank's request")
    logging.basicConfig(level=logging.WARNING)
    try:
        observation = run_rank(request)
    except Exception as e:
        bound = getattr(sys.modules.get(FUSION_MODULE), AGREEMENT_TIMEOUT, None)
        at = _FUSED_CALL_RAISED.get("at")
        wire.say(RAISED, dataclasses.asdict(Raised(
            rank=request.rank, error=f"{type(e).__name__}: {e}",
            after_fused_call_error_s=None if at is None else round(time.monotonic() - at, 3),
            agreement_timeout_s=None if bound is None else float(bound))))
        raise
    wire.say(RESULT, dataclasses.asdict(observation))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
