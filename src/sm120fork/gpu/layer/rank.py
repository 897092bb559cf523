"""One rank of SGLang's fused-norm layer path, started by :mod:`sm120fork.gpu.layer.cases`.

Run as ``python -m sm120fork.gpu.layer.rank '<json request>'`` with the SGLang tree
under test first on ``PYTHONPATH``.  It imports the real SGLang layer modules (the
RMSNorm that calls the fused all-reduce, ``layers.flashinfer_comm_fusion`` and the gate
that decides whether the fused path is taken, wired up by the request's upstream layout:
``sm120fork.layouts.<layout>.rank``), backs SGLang's TP group with a
gloo process group over the ranks (ranks are processes; on one GPU they share it), and
runs one case: the fused path, or a fault injected into workspace creation or into the
fused call on some ranks.  For each token count it compares the norm's output and the
new residual with a float32 reference computed from every rank's input.

What is replaced, and nothing else:

- SGLang's TP group (a gloo group; NCCL refuses two ranks on one GPU);
- SGLang's capability query: ``torch.cuda.get_device_capability`` answers 12.0 to callers
  in ``sglang.*`` only, so SGLang's SM12x gates are exercised while FlashInfer and torch
  see the real GPU and build for it;
- on a GPU, ``sgl_kernel`` (compiled for another torch; the unfused norm then runs
  SGLang's own ``forward_native``);
- with ``device: "cpu"`` (the CPU behaviour checks), everything the probe of
  ``harness.fake_gpu`` fakes, plus a FlashInfer stand-in whose workspace creation makes the
  same collectives as FlashInfer's trtllm backend (one exchange per buffer, then a
  barrier) and whose fused call computes the fused kernel's arithmetic over gloo.

This module must not import ``sm120fork`` beyond the probe's stubs: it runs beside the
tree under test, on machines that have torch but not the toolkit's dependencies.
It speaks the one wire format (:mod:`sm120fork.util.wire`, stdlib only): ``READY`` once
set up, then one ``RESULT`` (its observation) or one ``RAISED`` (its case raised).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from sm120fork.layouts import Layer
from sm120fork.layouts import adapter as layout_adapter
from sm120fork.util import wire

#: The wire tags: set up (every rank: the case's clock starts), the observation, and (a
#: rank whose case raised, instead of a result) what it raised, and when.
READY, RESULT, RAISED = "READY", "RESULT", "RAISED"
#: How long a rank whose fused call raised waits for its peers (S4's and G6's module
#: constant in the fusion module; the request's ``fused_call_agreement_timeout_s`` sets it).
AGREEMENT_TIMEOUT = "_FUSED_CALL_AGREEMENT_TIMEOUT_S"
#: How long a rank waits for a peer's file descriptor in FlashInfer's POSIX-fd exchange
#: (S4's constant; the request's ``handle_exchange_timeout_s`` sets it).
EXCHANGE_TIMEOUT = "_HANDLE_EXCHANGE_TIMEOUT_S"
#: The request's bounds -> the fusion module's constants they set (where the tree has one).
TREE_BOUNDS = {"fused_call_agreement_timeout_s": AGREEMENT_TIMEOUT,
               "handle_exchange_timeout_s": EXCHANGE_TIMEOUT}
FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
STUBBED_CAPABILITY = (12, 0)
#: Packages replaced by import stubs on a GPU machine (compiled for another torch).
GPU_STUBS = ("sgl_kernel",)

#: case -> (what is injected, on which ranks: "all", a rank number, or None).
CASES: dict[str, tuple[str | None, str | int | None]] = {
    "fused": (None, None),
    "all-ranks-create-fails": ("create-raises", "all"),
    "one-rank-create-fails": ("create-raises", 1),
    "one-rank-fails-midway": ("second-buffer-raises", 1),
    "one-rank-fails-late": ("create-returns-then-raises", 1),
    "fused-call-raises": ("fused-call-raises", "all"),
    "one-rank-fused-call-raises": ("fused-call-raises", 1),
    "rank-0-fused-call-raises": ("fused-call-raises", 0),
    "no-p2p": ("no-p2p", "all"),
    "one-rank-fails-in-fd-exchange": ("fd-exchange-raises", 1),
    "policy-eager": (None, None),
    "policy-graph": (None, None),
}
#: The policy cases: the request's ``policy_path`` is in force (every rank reads it where
#: SGLang looks), the steps run SGLang's consumer of the fused kernel and its unfused
#: completion, and each step reports the route that ran, seen by which function ran.
POLICY_CASES = ("policy-eager", "policy-graph")
POLICY_ENV = "SGLANG_SM120_ALLREDUCE_POLICY"
PCIE_IPC_MODULE = "sglang.srt.distributed.device_communicators.pcie_ipc_ar"
#: Rows the pcie_ipc workspace is built for before any step (SGLang's runner passes its
#: widest decode batch); the policy cases run at most this many tokens through it.
PCIE_IPC_ROWS = 64
#: Why a step of the graph case whose route is SGLang's unfused dispatch is not captured:
#: its all-reduce is the harness's gloo stand-in for NCCL (NCCL refuses two ranks on one
#: GPU), and a gloo all-reduce cannot be recorded into a CUDA graph.
NOT_CAPTURABLE = ("not captured: SGLang's unfused dispatch all-reduces through the "
                  "harness's gloo group here (NCCL refuses two ranks on one GPU), which a "
                  "CUDA graph cannot record; its route was taken and checked eagerly")

Observation = dict[str, Any]

#: "at": when the injected fused-call error was raised on this rank (monotonic), if it was.
_FUSED_CALL_RAISED: dict[str, float] = {}


def _module(name: str) -> Any:
    return importlib.import_module(name)


# --- the TP group --------------------------------------------------------------------


class GlooTPGroup:
    """SGLang's group coordinator as far as the layer path uses it, over gloo.

    Its device group is a second gloo group over the same ranks: in SGLang it is another
    communicator (NCCL) than the CPU group, so a collective on one never matches one on
    the other, and a rank in the wrong one waits (as on a GPU) instead of pairing up.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        dist = _module("torch.distributed")
        self.rank = self.rank_in_group = self.local_rank = rank
        self.world_size = world_size
        self.ranks = list(range(world_size))
        self.first_rank, self.last_rank = 0, world_size - 1
        self.unique_name = "tp:0"
        self.cpu_group = dist.group.WORLD
        self.device_group = dist.new_group(backend="gloo")
        self.all_reduce_calls = 0
        #: SGLang's GroupCoordinator communicators its dispatch reads: none here but
        #: pcie_ipc, which :meth:`attach_pcie_ipc` builds as SGLang does
        self.pcie_ipc_comm: Any = None
        self.ca_comm = self.qr_comm = self.pymscclpp_comm = None
        self.torch_symm_mem_comm = self.pynccl_comm = None

    def attach_pcie_ipc(self, device: Any) -> bool:
        """SGLang's pcie_ipc communicator, where SGLang's own ``eligible_group`` builds it
        for its TP group (named "tp"; the policy or SGLANG_ENABLE_PCIE_IPC_ALLREDUCE)."""
        pcie = _module(PCIE_IPC_MODULE)
        if pcie.eligible_group(group_name="tp", world_size=self.world_size,
                               deterministic=False):
            self.pcie_ipc_comm = pcie.PcieIpcCommunicator(
                group=self.device_group, device=device, cpu_group=self.cpu_group)
        return self.pcie_ipc_comm is not None

    def all_reduce(self, input_: Any) -> Any:
        """SGLang's dispatch where a pcie_ipc communicator exists (its own method choice,
        ``GroupCoordinator._resolve_outplace_all_reduce_method``, then its pcie_ipc entry,
        as ``_all_reduce_out_place`` calls it); otherwise the stand-in for NCCL: a sum
        over the ranks in float32 on the CPU, as NCCL would in the tensor's dtype."""
        if self.pcie_ipc_comm is not None:
            coordinator = _module("sglang.srt.distributed.parallel_state").GroupCoordinator
            if coordinator._resolve_outplace_all_reduce_method(self, input_) == "pcie_ipc":
                return self.pcie_ipc_comm.pcie_ipc_all_reduce(input_)
        dist = _module("torch.distributed")
        self.all_reduce_calls += 1
        total = input_.detach().float().cpu().contiguous()
        dist.all_reduce(total, group=self.cpu_group)
        return total.to(device=input_.device, dtype=input_.dtype)

    def all_gather_object(self, obj: Any) -> list[Any]:
        dist = _module("torch.distributed")
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def barrier(self) -> None:
        _module("torch.distributed").barrier(group=self.cpu_group)


# --- the capability query --------------------------------------------------------------


def stub_capability_for_sglang(capability: tuple[int, int]) -> None:
    """``get_device_capability`` answers ``capability`` to callers in ``sglang.*`` only."""
    torch = _module("torch")
    real = torch.cuda.get_device_capability

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == "sglang" or caller.startswith("sglang."):
            return capability
        return tuple(real(device))

    torch.cuda.get_device_capability = get_device_capability


def _stub_packages(names: Sequence[str]) -> None:
    probe = _probe()
    finder = probe._StubFinder()
    finder_packages = tuple(names)

    class _Only(type(finder)):  # type: ignore[misc]
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname.partition(".")[0] not in finder_packages:
                return None
            return super().find_spec(fullname, path, target)

    sys.meta_path.insert(0, _Only())


def _probe() -> Any:
    return _module("sm120fork.harness.fake_gpu")


# --- a FlashInfer stand-in for the CPU checks ----------------------------------------


def _register_cuda_ops_for_cpu_too() -> None:
    """SGLang registers its custom ops (the fused norm among them) for CUDA only."""
    library = _module("torch.library").Library
    real_impl = library.impl

    def impl(self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any,
             **kwargs: Any) -> Any:
        result = real_impl(self, op_name, fn, dispatch_key, *args, **kwargs)
        if dispatch_key == "CUDA":
            real_impl(self, op_name, fn, "CPU", *args, **kwargs)
        return result

    library.impl = impl


class _FakeBuffer:
    alive = 0

    def __init__(self) -> None:
        _FakeBuffer.alive += 1

    def __del__(self) -> None:
        _FakeBuffer.alive -= 1


class _FakeWorkspace:
    backend = "trtllm"

    def __init__(self, buffers: list[_FakeBuffer], *, use_fp32_lamport: bool = False) -> None:
        self.buffers = buffers
        self.destroyed = False
        self.group: Any = None
        self.metadata = {"use_fp32_lamport": use_fp32_lamport}

    def is_buffer_size_sufficient(self, **_: Any) -> bool:
        return not self.destroyed

    def destroy(self) -> None:
        self.buffers = []
        self.destroyed = True


class _WorldBackend:
    """What FlashInfer uses when SGLang passes no comm_backend: ``TorchDistBackend`` over
    the ``group`` SGLang passed (0.5.23: its device group), else the default group."""

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


class _PosixFdExchange:
    """FlashInfer 0.6.7's ``PosixFDHandleExchanger``, as its creation uses it: an AF_UNIX
    datagram socket per buffer (its name agreed by a ``bcast``); ``allgather`` takes, per
    peer, one barrier on the comm backend, then sends this rank's fd and blocks in
    ``recvmsg`` for the next one.  Outside the comm backend: a peer that fails between two
    barriers never sends.  ``fail_at`` makes this rank raise after that barrier."""

    def __init__(self, backend: Any, fail_at: int | None) -> None:
        self.backend, self.fail_at = backend, fail_at
        self.rank, self.size = backend.Get_rank(), backend.Get_size()
        op = backend.bcast(os.urandom(8).hex() if self.rank == 0 else None, 0)
        self.name = f"\0sm120fork-fd-{op}-"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.name + str(self.rank))

    #: A failing rank's socket stays open: FlashInfer's half-built buffer holds it until
    #: collected, so a peer's send still lands and the peer waits in recvmsg (the window).
    kept_open: ClassVar[list[socket.socket]] = []

    def allgather(self, fd: int) -> list[int]:
        import array
        received = []
        try:
            for step in range(self.size):
                self.backend.barrier()
                if step == self.fail_at:
                    _PosixFdExchange.kept_open.append(self.sock.dup())
                    raise RuntimeError("CUDA_ERROR_INVALID_HANDLE (injected inside the "
                                       "POSIX-fd handle exchange, after its barrier)")
                peer = (self.rank + step) % self.size
                self.sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                             array.array("i", [fd]))], 0, self.name + str(peer))
                _, ancdata, _, _ = self.sock.recvmsg(1, socket.CMSG_SPACE(4))
                got = array.array("i")
                got.frombytes(ancdata[0][2][:4])
                received.append(got[0])
        finally:
            self.sock.close()
            for other in received:
                os.close(other)
        return received


class FakeFlashInferComm:
    """``flashinfer.comm`` as SGLang 0.5.10's fusion module calls it, on the CPU.

    Workspace creation makes FlashInfer's trtllm collectives: per buffer an allocation
    then an exchange of handles, then a barrier.  ``fail_at_allocation`` makes the Nth
    allocation raise, as an out-of-memory would.
    """

    class AllReduceFusionPattern:
        kARResidualRMSNorm = 1  # noqa: N815 - FlashInfer's name

    def __init__(self) -> None:
        self.allocations = 0
        self.fail_at_allocation: int | None = None
        #: model 0.6.7's POSIX-fd exchange; fail inside it at this step (None: do not)
        self.posix_fd_exchange = False
        self.fail_in_fd_exchange_at: int | None = None

    def create_allreduce_fusion_workspace(self, *, comm_backend: Any = None,
                                          use_fp32_lamport: bool = False,
                                          group: Any = None, **_: Any) -> _FakeWorkspace:
        backend = comm_backend if comm_backend is not None else _WorldBackend(group)
        buffers = []
        for _index in range(3):
            self.allocations += 1
            if self.allocations == self.fail_at_allocation:
                raise RuntimeError(
                    "CUDA_ERROR_OUT_OF_MEMORY: out of memory (injected at allocation "
                    f"{self.allocations})")
            buffer = _FakeBuffer()
            buffers.append(buffer)
            if self.posix_fd_exchange:
                with open(os.devnull) as handle:  # the exported handle: a real fd
                    _PosixFdExchange(backend, self.fail_in_fd_exchange_at).allgather(
                        handle.fileno())
            else:
                backend.allgather(id(buffer))
        backend.barrier()
        workspace = _FakeWorkspace(buffers, use_fp32_lamport=use_fp32_lamport)
        workspace.group = group
        return workspace

    def allreduce_fusion(self, *, input: Any, residual_in: Any, rms_gamma: Any,
                         rms_eps: float, norm_out: Any, residual_out: Any,
                         workspace: Any = None, **_: Any) -> None:
        """The kernel's arithmetic; it reduces over the workspace's peers (its group)."""
        torch, dist = _module("torch"), _module("torch.distributed")
        total = input.float().clone()
        dist.all_reduce(total, group=getattr(workspace, "group", None))
        hidden = total + residual_in.float()
        variance = hidden.pow(2).mean(dim=-1, keepdim=True)
        norm_out.copy_(hidden * torch.rsqrt(variance + rms_eps) * rms_gamma.float())
        residual_out.copy_(hidden)


def use_fake_flashinfer(adapter: Any, fusion: Any, fake: FakeFlashInferComm) -> None:
    """Point SGLang's fusion module at the stand-in, as its import-time probe of FlashInfer
    would have; a layout whose module binds more of FlashInfer at import (the creation
    function, its signature, a cuMemCreate preflight) binds them in its adapter."""
    fusion._flashinfer_comm = fake
    bind = getattr(adapter, "use_fake_flashinfer", None)
    if bind is not None:
        bind(fusion, fake.create_allreduce_fusion_workspace)


class FakePcieIpcWorkspace:
    """FlashInfer's ``PcieIpcAllReduceWorkspace`` as SGLang's pcie_ipc communicator uses it,
    on the CPU: its all-reduce sums over the group it was built on (gloo)."""

    def __init__(self, *, group: Any, max_numel: int, **_: Any) -> None:
        self.group, self.max_numel = group, max_numel

    def supports(self, inp: Any) -> bool:
        return bool(inp.numel() <= self.max_numel)

    def rebind_stream(self) -> None:
        return None

    def tune(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def all_reduce(self, inp: Any) -> Any:
        total = inp.float().clone()
        _module("torch.distributed").all_reduce(total, group=self.group)
        return total.to(inp.dtype)

    def destroy(self) -> None:
        return None


def use_fake_pcie_ipc() -> None:
    """``flashinfer.comm`` offers the pcie_ipc workspace stand-in (CPU only); torch's
    current stream, which SGLang's pcie_ipc entry compares, is one fixed object."""
    _module("flashinfer.comm").PcieIpcAllReduceWorkspace = FakePcieIpcWorkspace
    stream = object()
    _module("torch").cuda.current_stream = lambda *args, **kwargs: stream


class RouteSpy:
    """Which all-reduce ran, seen by the functions that ran: FlashInfer's
    ``trtllm_allreduce_fusion`` (our fused path; on the CPU the stand-in's fused call),
    SGLang's pcie_ipc entry (``PcieIpcCommunicator.pcie_ipc_all_reduce``), and the TP
    group's plain all-reduce (SGLang's own dispatch, NCCL's stand-in here)."""

    def __init__(self, group: GlooTPGroup) -> None:
        self.group = group
        self.fused = self.pcie_ipc = 0
        self._mark = (0, 0, 0)

    def wrap(self, holder: Any, attr: str, counter: str) -> None:
        real = getattr(holder, attr)

        def spied(*args: Any, **kwargs: Any) -> Any:
            setattr(self, counter, getattr(self, counter) + 1)
            return real(*args, **kwargs)

        setattr(holder, attr, spied)

    def _now(self) -> tuple[int, int, int]:
        return self.fused, self.pcie_ipc, self.group.all_reduce_calls

    def start(self) -> None:
        self._mark = self._now()

    def route(self) -> str:
        fused, pcie, plain = (n - m for n, m in zip(self._now(), self._mark, strict=True))
        if fused and not pcie and not plain:
            return "fused"
        if pcie and not fused and not plain:
            return "pcie_ipc"
        if plain and not fused and not pcie:
            return "sglang_dispatch"
        return (f"mixed (trtllm_allreduce_fusion {fused}, pcie_ipc {pcie}, plain "
                f"all-reduce {plain})")


def spy_routes(group: GlooTPGroup, fake: FakeFlashInferComm | None) -> RouteSpy:
    spy = RouteSpy(group)
    if fake is not None:
        spy.wrap(fake, "allreduce_fusion", "fused")
    else:
        for name in ("flashinfer.comm.allreduce", "flashinfer.comm"):
            module = _module(name)
            if hasattr(module, "trtllm_allreduce_fusion"):
                spy.wrap(module, "trtllm_allreduce_fusion", "fused")
    spy.wrap(_module(PCIE_IPC_MODULE).PcieIpcCommunicator, "pcie_ipc_all_reduce", "pcie_ipc")
    return spy


def _inputs(tokens: int, hidden: int, world: int, dtype: Any, seed: int = 0,
            ) -> tuple[list[Any], Any]:
    torch = _module("torch")
    xs = [torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(
        seed + 1000 * r + tokens)).to(dtype) for r in range(world)]
    residual = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(
        seed + tokens)).to(dtype)
    return xs, residual


def policy_steps(*, layer: Layer, norm: Any, group: GlooTPGroup, spy: RouteSpy,
                 tokens_list: Sequence[int], hidden: int, dev: Any, dtype: Any,
                 weight: Any, eps: float, tolerance: float, graph: bool,
                 device_kind: str) -> list[dict[str, Any]]:
    """SGLang's layer path at each token count: its consumer of the fused kernel
    (``fused_ffn_input``, which asks ``flashinfer_ar_fusion_applies``), else its unfused
    completion (the attention-TP all-reduce, then the norm), eagerly or (``graph``)
    captured into a CUDA graph after one eager warm-up and replayed on new inputs."""
    torch = _module("torch")
    fusions = _module("sglang.srt.layers.layer_boundary.fusions.allreduce")
    comm_op = _module("sglang.srt.distributed.communication_op")
    plan = type("Plan", (), {"norm": norm, "fusions": None})()
    rank, world = group.rank, group.world_size

    def step(x: Any, r: Any) -> tuple[Any, Any]:
        fused = fusions.fused_ffn_input(plan, x, r, None)
        if fused is not None:
            return tuple(fused)
        return tuple(norm.forward(
            comm_op.attention_tensor_model_parallel_all_reduce(x), r))

    def check(out: Any, res: Any, xs: list[Any], residual: Any) -> dict[str, Any]:
        want_out, want_res = _reference(xs, residual, weight.to(dtype), eps)
        err_out, err_res = _relative_error(out, want_out), _relative_error(res, want_res)
        return {"norm_error": err_out, "residual_error": err_res,
                "correct": err_out <= tolerance and err_res <= tolerance}

    def sync() -> None:
        if device_kind == "cuda":
            torch.cuda.synchronize()

    steps = []
    for tokens in tokens_list:
        xs, residual = _inputs(tokens, hidden, world, dtype)
        spy.start()
        with _no_grad():
            out, res = step(xs[rank].to(dev).clone(), residual.to(dev).clone())
        sync()
        route = spy.route()
        record: dict[str, Any] = {"tokens": tokens, "route": route, "graph": graph,
                                  "path": route, **check(out, res, xs, residual)}
        if graph and device_kind == "cuda" and route == "sglang_dispatch":
            record["skipped"] = NOT_CAPTURABLE
        elif graph and device_kind == "cuda":
            static_x, static_r = xs[rank].to(dev).clone(), residual.to(dev).clone()
            cuda_graph = torch.cuda.CUDAGraph()
            spy.start()
            with _no_grad(), torch.cuda.graph(cuda_graph):
                out, res = step(static_x, static_r)
            record["route"] = record["path"] = spy.route()  # what was captured
            xs2, residual2 = _inputs(tokens, hidden, world, dtype, seed=7)
            static_x.copy_(xs2[rank].to(dev))
            static_r.copy_(residual2.to(dev))
            cuda_graph.replay()
            sync()
            record.update(check(out, res, xs2, residual2))
            del cuda_graph
        elif graph:  # the CPU stand-in: SGLang's side sees a capture in progress
            capturing = torch.cuda.is_current_stream_capturing
            torch.cuda.is_current_stream_capturing = lambda: True
            try:
                spy.start()
                with _no_grad():
                    out, res = step(xs[rank].to(dev).clone(), residual.to(dev).clone())
                record["route"] = record["path"] = spy.route()
                record.update(check(out, res, xs, residual))
            finally:
                torch.cuda.is_current_stream_capturing = capturing
        steps.append(record)
    return steps


# --- fault injection -------------------------------------------------------------------


def _inject(layer: Layer, fault: str, *, fake: FakeFlashInferComm | None) -> None:
    """Put ``fault`` into the real call path of this rank (never into the code under test)."""
    fusion = layer.fusion
    comm = fusion._flashinfer_comm
    holder, attr = comm, "create_allreduce_fusion_workspace"
    if getattr(fusion, "_create_allreduce_fusion_workspace", None) is not None:
        holder, attr = fusion, "_create_allreduce_fusion_workspace"  # 0.5.23 binds it
    real_create = getattr(holder, attr)

    if fault == "create-raises":
        def create(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: out of memory (injected before "
                               "workspace creation)")
        setattr(holder, attr, create)
    elif fault == "create-returns-then-raises":
        def create(*args: Any, **kwargs: Any) -> Any:
            real_create(*args, **kwargs)
            raise RuntimeError("cudaErrorLaunchFailure (injected after workspace creation)")
        setattr(holder, attr, create)
    elif fault == "second-buffer-raises":
        if fake is not None:
            fake.fail_at_allocation = 2
        else:
            trtllm_ar = _module("flashinfer.comm.trtllm_ar")
            real_symm = trtllm_ar.SymmDeviceMemory
            made = {"n": 0}

            def symm(*args: Any, **kwargs: Any) -> Any:
                made["n"] += 1
                if made["n"] == 2:
                    raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: out of memory (injected "
                                       "at the second workspace buffer)")
                return real_symm(*args, **kwargs)

            trtllm_ar.SymmDeviceMemory = symm
    elif fault == "fused-call-raises":
        def fused(*args: Any, **kwargs: Any) -> Any:
            _FUSED_CALL_RAISED["at"] = time.monotonic()
            raise ValueError("injected host-side check failure in allreduce_fusion")
        comm.allreduce_fusion = fused
    elif fault == "fd-exchange-raises":
        if fake is None:
            raise ValueError("fd-exchange-raises runs on the CPU (FlashInfer stand-in) only")
        fake.fail_in_fd_exchange_at = 1
    elif fault == "no-p2p":
        torch = _module("torch")
        torch.cuda.can_device_access_peer = lambda device, peer: False
    else:
        raise ValueError(f"unknown fault {fault!r}")


# --- the run ---------------------------------------------------------------------------


class _Warnings(logging.Handler):
    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _no_grad() -> Iterator[None]:
    with _module("torch").no_grad():
        yield


def _reference(xs: list[Any], residual: Any, weight: Any, eps: float) -> tuple[Any, Any]:
    torch = _module("torch")
    hidden = torch.stack([x.float() for x in xs]).sum(dim=0) + residual.float()
    variance = hidden.pow(2).mean(dim=-1, keepdim=True)
    return hidden * torch.rsqrt(variance + eps) * weight.float(), hidden


def _relative_error(got: Any, want: Any) -> float:
    scale = float(want.abs().max()) or 1.0
    return float((got.float().cpu() - want).abs().max()) / scale


def run_rank(request: dict[str, Any]) -> Observation:
    rank, world = int(request["rank"]), int(request["world_size"])
    device_kind = request.get("device", "cuda")
    case = request["case"]
    fault, where = CASES[case]
    hidden = int(request.get("hidden", 7168 if device_kind == "cuda" else 256))
    tokens_list = [int(t) for t in request.get("tokens", [1, 3, 16, 64, 128])]
    for name in [n for n in os.environ if n.startswith("SGLANG_")]:
        del os.environ[name]
    policy = case in POLICY_CASES
    if policy:  # where SGLang looks for the policy, in this rank as in every other
        os.environ[POLICY_ENV] = str(request["policy_path"])

    fake: FakeFlashInferComm | None = None
    if device_kind == "cpu":
        _probe().fake_gpu(STUBBED_CAPABILITY)
        torch = _module("torch")
        torch.cuda.current_device = lambda: rank  # one GPU per rank, as SGLang runs
        _register_cuda_ops_for_cpu_too()
    else:
        torch = _module("torch")
        torch.cuda.set_device(int(request.get("gpu", 0)))
        _module("flashinfer.comm")  # FlashInfer reads the real GPU before the stub exists
        _stub_packages(GPU_STUBS)
        stub_capability_for_sglang(STUBBED_CAPABILITY)

    dist = _module("torch.distributed")
    dist.init_process_group(
        "gloo", init_method=request["init_method"], rank=rank, world_size=world,
        timeout=dt.timedelta(seconds=float(request.get("collective_timeout_s", 120))))
    plugin_lines = _Warnings(logging.INFO)
    if request.get("load_plugins"):  # as every SGLang process does, before its work
        logging.getLogger("sm120fork.plugin").addHandler(plugin_lines)
        logging.getLogger("sm120fork.plugin").setLevel(logging.INFO)
        _module("sglang.srt.plugins").load_plugins()
    group = GlooTPGroup(rank, world)
    adapter = layout_adapter(request["layout"], "rank")
    layer: Layer = adapter.setup(group)
    if request.get("gates_in_memory"):
        adapter.patch_gates_in_memory(layer)
    for key, constant in TREE_BOUNDS.items():
        bound = request.get(key)
        if bound is not None and hasattr(layer.fusion, constant):  # stock has none
            setattr(layer.fusion, constant, float(bound))
    if device_kind == "cpu":
        fake = FakeFlashInferComm()
        use_fake_flashinfer(adapter, layer.fusion, fake)
    if fake is not None and case == "one-rank-fails-in-fd-exchange":
        fake.posix_fd_exchange = True  # every rank, as FlashInfer picks it per machine
    if fault is not None and (where in ("all", rank)):
        _inject(layer, fault, fake=fake)
    spy: RouteSpy | None = None
    pcie_ipc = False
    if policy:
        if fake is not None:
            use_fake_pcie_ipc()
        pcie_ipc = group.attach_pcie_ipc(torch.device("cuda", int(request.get("gpu", 0))))
        spy = spy_routes(group, fake)

    dev = torch.device("cpu") if device_kind == "cpu" else torch.device("cuda")
    # pcie_ipc all-reduces bf16 only: the policy cases run bf16 on the CPU too
    dtype = torch.float32 if device_kind == "cpu" and not policy else torch.bfloat16
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    eps = 1e-6
    # The model's dtype: FlashInfer's fused kernel reads gamma in the input's dtype.
    norm = layer.layernorm.RMSNorm(hidden, eps=eps).to(device=dev, dtype=dtype)
    gen = torch.Generator().manual_seed(7168)
    weight = (torch.rand(hidden, generator=gen) + 0.5)
    with _no_grad():
        norm.weight.copy_(weight.to(dtype))
    norm._forward_method = norm.forward_native  # sgl_kernel is not loaded here

    if pcie_ipc and device_kind == "cuda":  # before any step, as SGLang's runner does
        group.pcie_ipc_comm.prepare(hidden=hidden, max_rows=PCIE_IPC_ROWS)

    warnings = _Warnings()
    logging.getLogger(FUSION_MODULE).addHandler(warnings)
    pcie_log = _Warnings(logging.INFO)  # what SGLang's pcie_ipc communicator said
    logging.getLogger(PCIE_IPC_MODULE).addHandler(pcie_log)
    logging.getLogger(PCIE_IPC_MODULE).setLevel(logging.INFO)
    dist.barrier()
    wire.say(READY)
    gate_before = layer.gate(tokens_list[0])
    steps = []
    started = time.monotonic()
    if spy is not None:
        steps = policy_steps(layer=layer, norm=norm, group=group, spy=spy,
                             tokens_list=tokens_list, hidden=hidden, dev=dev, dtype=dtype,
                             weight=weight, eps=eps, tolerance=tolerance,
                             graph=case == "policy-graph", device_kind=device_kind)
    for tokens in tokens_list if spy is None else ():
        xs = [torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(
            1000 * r + tokens)).to(dtype) for r in range(world)]
        residual = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(
            tokens)).to(dtype)
        x_in, r_in = xs[rank].to(dev), residual.to(dev)
        gate = layer.gate(tokens)
        calls = group.all_reduce_calls
        with _no_grad():
            if gate:
                out, res = norm.forward_with_allreduce_fusion(x_in.clone(), r_in.clone())
            else:  # what the communicator does when the gate is off
                out, res = norm.forward(group.all_reduce(x_in.clone()), r_in.clone())
        if device_kind == "cuda":
            torch.cuda.synchronize()
        reduced = group.all_reduce_calls > calls
        path = "unfused" if not gate else ("fallback" if reduced else "fused")
        want_out, want_res = _reference(xs, residual, weight.to(dtype), eps)
        err_out, err_res = _relative_error(out, want_out), _relative_error(res, want_res)
        steps.append({"tokens": tokens, "gate": gate, "path": path,
                      "norm_error": err_out, "residual_error": err_res,
                      "correct": err_out <= tolerance and err_res <= tolerance})
    observation: Observation = {
        "rank": rank,
        "case": case,
        "layout": layer.layout,
        "device": device_kind,
        "injected": fault if (fault is not None and (where in ("all", rank)))
        else None,
        "gate_before": gate_before,
        "gate_after": layer.gate(tokens_list[0]),
        "unavailable": bool(layer.fusion.is_flashinfer_allreduce_unavailable()),
        "workspace_ready": layer.workspace_ready(),
        "warnings": warnings.messages,
        "plugin": plugin_lines.messages,
        "steps": steps,
        "pcie_ipc_built": pcie_ipc,
        "pcie_ipc_log": pcie_log.messages[-8:],
        "tolerance": tolerance,
        "seconds": round(time.monotonic() - started, 3),
    }
    if fake is not None:
        observation["fake_buffers_alive"] = _FakeBuffer.alive
    dist.barrier()
    dist.destroy_process_group()
    return observation


def _raised(request: dict[str, Any], error: BaseException) -> dict[str, Any]:
    """What a rank whose case raised reports: the error, how long after the injected
    fused-call error it came, and the agreement timeout the tree under test had."""
    fusion = sys.modules.get(FUSION_MODULE)
    bound = getattr(fusion, AGREEMENT_TIMEOUT, None)
    return {
        "rank": int(request["rank"]), "case": request["case"],
        "layout": request.get("layout"),
        "error": f"{type(error).__name__}: {error}",
        "after_fused_call_error_s": None if "at" not in _FUSED_CALL_RAISED
        else round(time.monotonic() - _FUSED_CALL_RAISED["at"], 3),
        "agreement_timeout_s": None if bound is None else float(bound),
    }


def main(argv: Sequence[str]) -> int:
    request = json.loads(argv[0])
    logging.basicConfig(level=logging.WARNING)
    try:
        observation = run_rank(request)
    except Exception as e:
        wire.say(RAISED, _raised(request, e))
        raise
    wire.say(RESULT, observation)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

