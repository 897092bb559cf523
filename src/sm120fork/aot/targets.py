"""Which GPUs the AOT module is built for: compute capabilities, which FlashInfer's own
compilation context turns into targets (every 12.x -> sm_120f), so nothing is re-invented."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from sm120fork.errors import ConfigError

#: Hopper, the Blackwell datacenter family (B200, B300), Thor, RTX PRO 6000 / RTX 50xx
#: and DGX Spark.  Thor (11.0) is listed so that a module gate that refuses it says so.
DEFAULT_CAPABILITIES: tuple[str, ...] = ("9.0", "10.0", "10.3", "11.0", "12.0", "12.1")

_CAPABILITY = re.compile(r"^(\d+)\.(\d)$")
_GENCODE = re.compile(r"^-gencode=arch=compute_(\w+),code=sm_(\w+)$")


def parse_capabilities(items: Iterable[str]) -> tuple[str, ...]:
    """``["9.0", "12.0"]`` -> validated, de-duplicated, in order."""
    out: list[str] = []
    for item in items:
        text = item.strip()
        if not _CAPABILITY.match(text):
            raise ConfigError(f"not a compute capability: {item!r}", where="--capabilities",
                              fix="write MAJOR.MINOR, e.g. 9.0,10.0,12.0")
        if text not in out:
            out.append(text)
    if not out:
        raise ConfigError("no compute capabilities given", where="--capabilities")
    return tuple(out)


def arch_list(capabilities: Sequence[str]) -> str:
    """The ``FLASHINFER_CUDA_ARCH_LIST`` value (space separated, FlashInfer normalises)."""
    return " ".join(capabilities)


def targets_from_flags(flags: Sequence[str]) -> tuple[str, ...]:
    """``-gencode=arch=compute_90a,code=sm_90a`` ... -> ``("sm_90a", ...)`` in flag order."""
    found: list[str] = []
    for flag in flags:
        match = _GENCODE.match(flag)
        if match and f"sm_{match.group(2)}" not in found:
            found.append(f"sm_{match.group(2)}")
    return tuple(found)
