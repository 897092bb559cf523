"""One rank process: its frame, ``python -m sm120fork.gpu.<harness>.worker SPEC RANK``, and
its state (gloo process group, device, P2P check, FlashInfer workspaces through CUDA IPC, so
ranks may share a GPU); and the compile step, ``python -m sm120fork.gpu.core.worker SPEC``:
what a rank reports of its machine, and the module build.  FlashInfer and torch are untyped
here."""

from __future__ import annotations

import concurrent.futures
import ctypes
import importlib
import importlib.metadata
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sm120fork.gpu.core.cases import CUSTOM_API
from sm120fork.gpu.core.documents import Environment
from sm120fork.gpu.core.safety import MULTICAST_OFF_ENV, check_backend
from sm120fork.util import wire

EXIT_CUDA_ERROR = 3
EXIT_FATAL = 4
say = wire.say


def stage(name: str) -> None:
    """Plain progress line: a hung case's log tail then says where it hung."""
    print(f"stage: {name}", flush=True)


def capture_graph(fns: Sequence[Callable[[], None]], repeat: int = 1) -> Any:
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


def hard_exit(code: int) -> None:
    """Exit without teardown: with a poisoned CUDA context or IPC mappings open, atexit
    hooks can hang, and a hung exit would look like a hung case."""
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


#: The legacy custom all-reduce's constants (FlashInfer's ``trtllm_allreduce.cuh``).
MAX_ALL_REDUCE_BLOCKS = 24
LAMPORT_TOKEN_NUM_THRESHOLD = 16


def legacy_workspace_sizes(world: int, max_tokens: int, hidden: int, align: int = 1 << 21
                           ) -> list[int]:
    """The seven IPC buffers of ``trtllm_custom_all_reduce``, sized as FlashInfer's own
    creator did before 0.7.4 removed it, rounded up to ``align`` bytes."""
    data = world * max_tokens * hidden * 4
    flags = (MAX_ALL_REDUCE_BLOCKS + 1) * 4 * world * 2
    lamport = world * LAMPORT_TOKEN_NUM_THRESHOLD * world * hidden * 2
    return [-(-size // align) * align for size in (data, data, flags, flags,
                                                   lamport, lamport, lamport)]


def legacy_custom_all_reduce(fc: Any) -> Any:
    """FlashInfer's ``trtllm_custom_all_reduce`` wrapper, else (0.7.4+) the comm module's."""
    wrapper = getattr(fc, "trtllm_custom_all_reduce", None)
    if wrapper is not None:
        return wrapper
    from flashinfer.jit.comm import (  # type: ignore[import-not-found, unused-ignore]
        gen_trtllm_comm_module,
    )

    return gen_trtllm_comm_module().build_and_load().trtllm_custom_all_reduce


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
        peers = [] if self.shared else [p for p in range(self.world) if p != self.device.index]
        for other in peers:
            if not torch.cuda.can_device_access_peer(self.device.index, other):
                say("FATAL", f"GPU {self.device.index} cannot access GPU {other} peer-to-peer "
                    "(P2P disabled by driver or topology); the fused all-reduce needs P2P "
                    "through CUDA IPC, so it must stay disabled on this machine")
                hard_exit(EXIT_FATAL)
        import flashinfer.comm as fc  # type: ignore[import-not-found, unused-ignore]

        self.fc = fc
        self.flag = 1
        self._workspaces: dict[str, Any] = {}
        self._workspace_errors: dict[str, str] = {}

    def barrier(self) -> None:
        dist.barrier()

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
            sizes = legacy_workspace_sizes(self.world, custom_tokens, max_hidden)
            if hasattr(fc, "trtllm_create_ipc_workspace_for_all_reduce"):
                handles = fc.trtllm_create_ipc_workspace_for_all_reduce(
                    self.rank, self.world, custom_tokens, max_hidden, group=None)
            else:  # FlashInfer >= 0.7.4 dropped the wrapper; the kernel entry point stays
                handles = [fc.cuda_ipc.create_shared_buffer(size, None) for size in sizes]
                fc.trtllm_lamport_initialize_all(handles[4][self.rank], handles[5][self.rank],
                                                 handles[6][self.rank], sizes[4] // 2,
                                                 torch.float16)
            # lamportInitializeAll divides its size by sizeof(T): it takes bytes.
            flag_bytes, _, lamport_bytes = legacy_workspace_sizes(
                self.world, custom_tokens, max_hidden, align=1)[2:5]
            cudart = fc.cuda_ipc.cudart
            for idx in (2, 3):  # barrier flags must start at zero (cudaMalloc does not clear)
                cudart.cudaMemset(ctypes.c_void_p(handles[idx][self.rank]), 0, flag_bytes)
            torch.cuda.synchronize()
            self.barrier()
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

    def next_flag(self) -> int:
        self.flag += 1
        return self.flag - 1


def import_failure(exc: BaseException) -> str:
    """``exc`` in one line and, for a module that did not import, where Python looked and
    which installed distributions provide it."""
    text = f"{type(exc).__name__}: {exc}"
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    missing = next((e.name for e in chain if isinstance(e, ModuleNotFoundError) and e.name),
                   None)
    if missing is None:
        return text
    top = missing.partition(".")[0]
    module = sys.modules.get(top)
    looked = (f"{top!r} is in none of sys.path {sys.path}" if module is None else
              f"{top!r} resolved to {list(getattr(module, '__path__', [module.__file__]))}")
    dists = sorted(set(importlib.metadata.packages_distributions().get(top, [])))
    have = [f"{d} {importlib.metadata.version(d)} in "
            f"{importlib.metadata.distribution(d).locate_file('')}" for d in dists]
    return f"{text} ({looked}; installed that provide {top!r}: {', '.join(have) or 'none'})"


def environment() -> Environment:
    env: Environment = {
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
        env["flashinfer_error"] = import_failure(exc)
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found, unused-ignore]

        driver.cuInit(0)
        _err, version = driver.cuDriverGetVersion()
        env["driver_cuda_api"] = version
        attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
        _err, mc = driver.cuDeviceGetAttribute(attr, 0)  # a query only: creates nothing
        env["multicast_supported_attr"] = int(mc)
    except Exception as exc:
        env["driver_query_error"] = import_failure(exc)
    return env


def _builder(module: str, name: str) -> Callable[[], Callable[[], object]]:
    """A loader that imports ``module`` and returns its ``name``, which builds the module."""
    return lambda: getattr(importlib.import_module(module), name)


def _load_norm() -> Callable[[], object]:
    from flashinfer.norm import fused_add_rmsnorm  # type: ignore[import-not-found, unused-ignore]

    def build() -> None:
        x = torch.randn(2, 256, device="cuda", dtype=torch.bfloat16)
        fused_add_rmsnorm(x, torch.randn_like(x), torch.ones(256, device="cuda",
                                                             dtype=torch.bfloat16))
        torch.cuda.synchronize()
    return build


#: module name -> (loader, required).  A loader imports in the main thread (threads can
#: see half-initialised packages) and returns the build step, run in a thread; a failed
#: required module fails the variant, an optional one only its bench method.
MODULES: dict[str, tuple[Callable[[], Callable[[], object]], bool]] = {
    "comm": (_builder("flashinfer.comm.trtllm_ar", "get_trtllm_comm_module"), True),
    "norm": (_load_norm, True),
    "pcie_ipc": (_builder("flashinfer.comm", "get_pcie_ipc_comm_module"), False),
    "vllm": (_builder("flashinfer.comm.vllm_ar", "get_vllm_comm_module"), False),
}


def run_compile(modules: list[str]) -> None:
    """Build (or load) every module at once, in threads: FlashInfer's JIT runs one ninja
    per module, so the minutes of the comm module and the others overlap."""
    say("ENV", environment())
    failed_required: list[str] = []

    def failed(name: str, exc: BaseException) -> None:
        say("MODULE", {"module": name, "ok": False,
                       "reason": import_failure(exc)[:2000]})
        if MODULES[name][1]:
            failed_required.append(name)

    steps: dict[str, Callable[[], object]] = {}
    for name in modules:  # imports one after the other, here
        try:
            steps[name] = MODULES[name][0]()
        except Exception as exc:
            failed(name, exc)

    def build(name: str) -> None:
        try:
            steps[name]()
        except Exception as exc:
            failed(name, exc)
            return
        say("MODULE", {"module": name, "ok": True})
        print(f"compiled/loaded {name} module", flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(steps) or 1) as pool:
        list(pool.map(build, steps))
    if failed_required:
        raise RuntimeError(f"required modules failed: {failed_required}")


Job = Callable[[Rank, dict[str, Any]], None]


def main(argv: list[str], jobs: Mapping[str, Job]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    mode = spec["mode"]
    if mode == "compile":
        run_compile(list(spec.get("modules", ["comm"])))
        say("DONE")
        return 0
    job = jobs.get(mode)
    if job is None:  # another harness's spec: refused before the rank joins its group
        raise ValueError(f"unknown mode {mode}")
    rank = int(argv[1])
    rk = Rank(spec, rank)
    if rank == 0:
        say("ENV", {**environment(), "shared": rk.shared, "world_size": rk.world})
    job(rk, spec)
    rk.barrier()
    say("DONE")
    hard_exit(0)
    return 0


def serve(jobs: Mapping[str, Job]) -> None:
    """A worker module's ``__main__``: run, and leave without torch's atexit handlers."""
    try:
        hard_exit(main(sys.argv[1:], jobs))
    except Exception:
        traceback.print_exc()
        hard_exit(1)


if __name__ == "__main__":
    serve({})
