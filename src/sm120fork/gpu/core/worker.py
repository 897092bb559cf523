"""The frame of one rank process, ``python -m sm120fork.gpu.<harness>.worker SPEC RANK``,
and the compile step, ``python -m sm120fork.gpu.core.worker SPEC``: what a rank reports of
its machine, and the module build."""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.metadata
import json
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from sm120fork.gpu.core.documents import Environment
from sm120fork.gpu.core.rank import Rank, hard_exit, say


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
