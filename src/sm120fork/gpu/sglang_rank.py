"""One rank of SGLang's fused-norm layer path, started by :mod:`sm120fork.gpu.sglang_layer`.

Run as ``python -m sm120fork.gpu.sglang_rank '<json request>'`` with the SGLang tree
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
It prints one line ``SM120FORK-SGLANG-RANK <json>``.
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

RESULT_MARKER = "SM120FORK-SGLANG-RANK "
READY_MARKER = "SM120FORK-SGLANG-READY"
#: The line of a rank whose case raised (instead of a result): what, and when.
RAISED_MARKER = "SM120FORK-SGLANG-RAISED "
#: How long a rank whose fused call raised waits for its peers (S4's and G6's module
#: constant in the fusion module; the request's ``fused_call_agreement_timeout_s`` sets it).
AGREEMENT_TIMEOUT = "_FUSED_CALL_AGREEMENT_TIMEOUT_S"
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
}

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

    def all_reduce(self, input_: Any) -> Any:
        """Sum over the ranks in float32 on the CPU, as NCCL would in the tensor's dtype."""
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
    bound = request.get("fused_call_agreement_timeout_s")
    if bound is not None and hasattr(layer.fusion, AGREEMENT_TIMEOUT):  # stock has none
        setattr(layer.fusion, AGREEMENT_TIMEOUT, float(bound))
    if device_kind == "cpu":
        fake = FakeFlashInferComm()
        use_fake_flashinfer(adapter, layer.fusion, fake)
    if fake is not None and case == "one-rank-fails-in-fd-exchange":
        fake.posix_fd_exchange = True  # every rank, as FlashInfer picks it per machine
    if fault is not None and (where in ("all", rank)):
        _inject(layer, fault, fake=fake)

    dev = torch.device("cpu") if device_kind == "cpu" else torch.device("cuda")
    dtype = torch.float32 if device_kind == "cpu" else torch.bfloat16
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    eps = 1e-6
    # The model's dtype: FlashInfer's fused kernel reads gamma in the input's dtype.
    norm = layer.layernorm.RMSNorm(hidden, eps=eps).to(device=dev, dtype=dtype)
    gen = torch.Generator().manual_seed(7168)
    weight = (torch.rand(hidden, generator=gen) + 0.5)
    with _no_grad():
        norm.weight.copy_(weight.to(dtype))
    norm._forward_method = norm.forward_native  # sgl_kernel is not loaded here

    warnings = _Warnings()
    logging.getLogger(FUSION_MODULE).addHandler(warnings)
    dist.barrier()
    sys.stdout.write(READY_MARKER + "\n")
    sys.stdout.flush()
    gate_before = layer.gate(tokens_list[0])
    steps = []
    started = time.monotonic()
    for tokens in tokens_list:
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
        sys.stdout.write(RAISED_MARKER + json.dumps(_raised(request, e)) + "\n")
        sys.stdout.flush()
        raise
    sys.stdout.write(RESULT_MARKER + json.dumps(observation) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

