"""CUDA architecture names: ``sm_120a`` -> FlashInfer's arch list entry, nvcc's flag."""

from __future__ import annotations

import re

from sm120fork.errors import VerifyError

#: The architecture every other build's kernels are compared with.
REFERENCE_ARCH = "sm_90a"
#: What FlashInfer's compilation context builds for every 12.x GPU (CUDA >= 12.9): the
#: cubin SM120 and SM121 users run.
SHIPPED_SM12X_ARCH = "sm_120f"

_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([a-z]?)$")


def arch_list_entry(arch: str) -> str:
    """The FLASHINFER_CUDA_ARCH_LIST entry: ``sm_120a`` -> ``12.0a``; ``sm_120f`` -> ``12.0``
    (FlashInfer normalises a 12.x capability to compute_120f itself)."""
    match = _ARCH_RE.match(arch)
    if not match:
        raise VerifyError(f"not an architecture name: {arch!r}",
                          fix="use e.g. sm_90a, sm_120a or sm_120f")
    major, minor, suffix = match.groups()
    return f"{major}.{minor}" + ("" if suffix == "f" else suffix)


def gencode_flag(arch: str) -> str:
    """``sm_120a`` -> ``-gencode=arch=compute_120a,code=sm_120a``."""
    arch_list_entry(arch)
    number = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{number},code=sm_{number}"


def is_sm12x(arch: str) -> bool:
    match = _ARCH_RE.match(arch)
    return bool(match) and match.group(1) == "12"  # type: ignore[union-attr]
