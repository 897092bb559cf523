"""What a rank or the compile step reports about its machine, and the module build."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from sm120fork.gpu.rank import say


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

