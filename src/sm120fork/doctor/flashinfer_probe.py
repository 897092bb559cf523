"""Ask the installed FlashInfer where it would load the trtllm comm module from, and why.

Runs in its own interpreter (``python -m <package>.doctor.flashinfer_probe``), as it imports
FlashInfer and torch.  Every answer is FlashInfer's own: its paths, its CUDA, its arch per
compute capability and that mapping's CUDA floor, its comm module spec and ``is_aot``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from ..util import wire
from .facts import Arch, Comm, FlashInfer, Provenance

#: CUDA versions tried against FlashInfer's own architecture mapping to find its floor.
CANDIDATE_CUDA = ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7",
                  "12.8", "12.9", "13.0", "13.1", "13.2", "13.3", "14.0")
TAG = "FLASHINFER"  # its one message on the one wire format (util/wire.py)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _floors(capabilities: list[tuple[int, int]]) -> dict[str, Arch]:
    """Per capability: FlashInfer's arch for it at the CUDA it sees, and its lowest CUDA."""
    context = importlib.import_module("flashinfer.compilation_context")
    cpp_ext = importlib.import_module("flashinfer.jit.cpp_ext")
    from packaging.version import Version

    normalize = context.CompilationContext._normalize_cuda_arch
    out: dict[str, Arch] = {}
    for major, minor in capabilities:
        entry: Arch = {}
        try:
            entry["arch"] = "".join(map(str, normalize(major, minor)))
        except Exception as exc:
            entry["error"] = str(exc)
        entry["floor"] = None
        for candidate in CANDIDATE_CUDA:
            with mock.patch.object(cpp_ext, "is_cuda_version_at_least",
                                   lambda v, c=candidate: Version(c) >= Version(v)):
                try:
                    normalize(major, minor)
                except Exception:
                    continue
            # accepted by the oldest CUDA tried: no floor of its own
            entry["floor"] = None if candidate == CANDIDATE_CUDA[0] else candidate
            break
        out[f"{major}.{minor}"] = entry
    return out


def _cuda(facts: FlashInfer) -> None:
    cpp_ext = importlib.import_module("flashinfer.jit.cpp_ext")
    try:
        facts["cuda_version"] = str(cpp_ext.get_cuda_version())
    except Exception as exc:
        facts["cuda_version"], facts["cuda_error"] = None, _error(exc)
    try:
        home = cpp_ext.get_cuda_path()
        nvcc = Path(home) / "bin" / "nvcc"
        facts["cuda_from"] = "nvcc" if nvcc.is_file() else "torch"
        facts["nvcc"] = str(nvcc) if nvcc.is_file() else None
    except Exception as exc:
        facts["cuda_from"], facts["nvcc"] = "torch", None
        facts["cuda_path_error"] = _error(exc)
    torch = sys.modules.get("torch") or importlib.import_module("torch")
    facts["torch_cuda"] = getattr(torch.version, "cuda", None)


def _comm(facts: FlashInfer, env: Any) -> None:
    comm: Comm = {}
    facts["comm"] = comm
    try:
        spec = importlib.import_module("flashinfer.jit.comm").gen_trtllm_comm_module()
    except Exception as exc:
        comm["spec_error"] = str(exc)
        return
    verdicts = getattr(spec, "prebuilt_verdicts", None)
    if callable(verdicts):   # our builds that search several prebuilt folders
        comm["copies"] = [{"path": str(path), "load": bool(load), "why": str(why)}
                          for path, load, why in verdicts()]
    aot, jit = Path(spec.aot_path), Path(spec.jit_library_path)
    comm.update({"aot_path": str(aot), "aot_exists": aot.is_file(), "jit_path": str(jit),
                 "jit_exists": jit.is_file()})
    comm["is_aot"] = bool(spec.is_aot)      # FlashInfer's own verdict (ours checks the digest)
    try:
        provenance = importlib.import_module("flashinfer.jit.provenance")
    except ImportError:
        comm["provenance"] = None   # stock FlashInfer: loads any prebuilt module that exists
        return
    marker = Path(provenance.marker_path(aot))
    found: Provenance = {"marker": str(marker), "recorded": None, "sources": None,
                         "mismatch": None}
    comm["provenance"] = found
    with contextlib.suppress(OSError):
        found["recorded"] = marker.read_text(encoding="utf-8").strip()
    found["sources"] = provenance.sources_digest(env.FLASHINFER_CSRC_DIR,
                                                 env.FLASHINFER_INCLUDE_DIR)
    mismatch = getattr(provenance, "prebuilt_mismatch", None)
    if aot.is_file() and callable(mismatch):
        found["mismatch"] = mismatch(aot, env.FLASHINFER_CSRC_DIR, env.FLASHINFER_INCLUDE_DIR)


def probe(capabilities: list[tuple[int, int]]) -> FlashInfer:
    logging.disable(logging.WARNING)   # FlashInfer's import-time warnings go to stderr anyway
    facts: FlashInfer = {}
    try:
        importlib.import_module("flashinfer")
    except Exception as exc:
        facts["import_error"] = _error(exc)
    try:
        env = importlib.import_module("flashinfer.jit.env")
    except Exception as exc:
        facts.setdefault("import_error", _error(exc))
        return facts
    facts["version"] = str(env.flashinfer_version)
    facts["aot_dir"] = str(env.FLASHINFER_AOT_DIR)
    facts["jit_cache_package"] = bool(env.has_flashinfer_jit_cache())
    providers = getattr(env, "prebuilt_provider_dirs", None)
    if callable(providers):   # packages with a flashinfer.prebuilt entry point (our builds)
        facts["prebuilt_providers"] = [[str(n), str(d)] for n, d in providers()]
    elif hasattr(env, "FLASHINFER_AOT_PROVIDERS"):   # 0.7.x: providers its jit-cache shim found
        facts["prebuilt_providers"] = [[str(p.provider_id), str(p.jit_cache_dir)]
                                       for p in env.FLASHINFER_AOT_PROVIDERS]
    if facts["jit_cache_package"]:
        cache = importlib.import_module("flashinfer_jit_cache")
        facts["jit_cache"] = {"version": str(getattr(cache, "__version__", None)),
                              "built_by": getattr(cache, "BUILT_BY", None)}
    facts["workspace_dir"] = str(env.FLASHINFER_WORKSPACE_DIR)
    facts["jit_dir"] = str(env.FLASHINFER_JIT_DIR)
    facts["cache_root"] = str(env.FLASHINFER_CACHE_DIR)
    own = Path(env.FLASHINFER_WORKSPACE_DIR)
    facts["other_caches"] = sorted(
        str(p) for p in Path(env.FLASHINFER_CACHE_DIR).glob("*/*/cached_ops/trtllm_comm/*.so")
        if own not in p.parents)
    try:
        context = importlib.import_module("flashinfer.jit.core").current_compilation_context
        facts["target_archs"] = sorted(f"{a}{b}" for a, b in context.TARGET_CUDA_ARCHS)
    except Exception as exc:
        facts["target_archs_error"] = _error(exc)
    steps: list[Callable[[], None]] = [lambda: _cuda(facts),
                                       lambda: facts.update({"archs": _floors(capabilities)}),
                                       lambda: _comm(facts, env)]
    for step in steps:
        try:
            step()
        except Exception as exc:
            facts.setdefault("errors", []).append(_error(exc))
    facts["disable_jit"] = bool(os.environ.get("FLASHINFER_DISABLE_JIT"))
    return facts


def main(argv: list[str]) -> int:
    capabilities = [(int(a), int(b)) for a, b in (x.split(".") for x in argv)]
    try:
        result = probe(capabilities)
    except Exception as exc:
        result = {"import_error": _error(exc)}
    wire.say(TAG, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
