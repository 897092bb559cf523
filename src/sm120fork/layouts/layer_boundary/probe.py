"""Probe of layout ``layer_boundary``: ``python -m ... '<json request>'`` beside the tree
under test, SGLang's own code with only the GPU and CUDA driver bindings faked; it
observes, ``checks`` judges."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, TypedDict

from sm120fork.harness.fake_gpu import (
    Observation,
    _module,
    captured_logs,
    emit,
    environ,
    start_probe,
)

#: The model that motivated the work (61 layers, hidden 7168), on upstream's fusion list.
FUSION_MODEL_ARCH = "KimiK25ForConditionalGeneration"
AUTO_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
PLAIN_ENV = "SGLANG_SM120_FLASHINFER_PLAIN_ALLREDUCE"
BACKENDS = ("auto", "trtllm", "mnnvl", "cutedsl")
#: Granularities the fake driver reports (bytes).
ALLOC_GRANULARITY = 2 << 20
MULTICAST_GRANULARITY = 64 << 20


class AutoScenario(TypedDict):
    tp: int
    nodes: int
    env: NotRequired[str]
    backend: NotRequired[str]
    enforce_disable: NotRequired[bool]


def _error(exc: Exception) -> Observation:
    return {"observed": "error", "detail": f"{type(exc).__name__}: {exc}"}


def run_resolve() -> list[Observation]:
    fusion = _module("sglang.srt.layers.flashinfer_comm_fusion")
    results = []
    for backend in BACKENDS:
        for nodes in (1, 2):
            name = f"{backend} nodes{nodes}"
            try:
                resolved = fusion._resolve_backend(backend, nodes > 1)
            except ValueError as exc:
                results.append({"name": name, **_error(exc)})
                continue
            results.append({"name": name, "observed": resolved, "detail": ""})
    return results


def auto_scenarios() -> list[tuple[str, AutoScenario]]:
    scenarios: list[tuple[str, AutoScenario]] = []
    for nodes in (1, 2):
        for tp in (1, 2, 4, 8):
            scenarios.append((f"auto tp{tp} nodes{nodes}", {"tp": tp, "nodes": nodes}))
    for env in ("0", "off", "1", "on"):
        for tp in (2, 4, 8):
            scenarios.append((f"auto tp{tp} nodes1 {AUTO_ENV}={env}",
                              {"tp": tp, "nodes": 1, "env": env}))
    scenarios.append((f"auto tp2 nodes2 {AUTO_ENV}=1", {"tp": 2, "nodes": 2, "env": "1"}))
    scenarios.append((f"auto tp2 nodes1 {AUTO_ENV}=maybe", {"tp": 2, "nodes": 1, "env": "maybe"}))
    for tp in (2, 4, 8):
        scenarios.append((f"explicit-trtllm tp{tp} nodes1",
                          {"tp": tp, "nodes": 1, "backend": "trtllm"}))
    scenarios.append(("enforce-disable auto tp2 nodes1",
                      {"tp": 2, "nodes": 1, "enforce_disable": True}))
    scenarios.append(("enforce-disable explicit-trtllm tp4 nodes1",
                      {"tp": 4, "nodes": 1, "backend": "trtllm", "enforce_disable": True}))
    return scenarios


def _auto_case(*, tp: int, nodes: int, env: str | None = None, backend: str | None = None,
               enforce_disable: bool = False) -> Observation:
    msgspec = _module("msgspec")
    torch = _module("torch")
    overrides = _module("sglang.srt.arg_groups.overrides")
    fusion = _module("sglang.srt.layers.flashinfer_comm_fusion")
    ServerArgs = _module("sglang.srt.server_args").ServerArgs  # noqa: N806

    args = ServerArgs(model_path="sm120fork/probe-model", tp_size=tp, nnodes=nodes,
                      flashinfer_allreduce_fusion_backend=backend,
                      enforce_disable_flashinfer_allreduce_fusion=enforce_disable)
    # model_config_of() hands a fixture's configuration back as it is (no download).
    hf_config = types.SimpleNamespace(architectures=[FUSION_MODEL_ARCH], model_type="kimi_k25")
    msgspec.Struct.__setattr__(args, "_model_config", types.SimpleNamespace(
        hf_config=hf_config, dtype=torch.bfloat16))
    with environ(AUTO_ENV, env), captured_logs("sglang.srt.arg_groups.overrides") as logs:
        try:
            for post_pass in (overrides._flashinfer_allreduce_fusion_auto_enable,
                              overrides._enforce_disable_allreduce_fusion):
                overrides.run_post_process_pass(args, post_pass)
        except ValueError as exc:
            return _error(exc)
    chosen = overrides.resolution_result(args, "flashinfer_allreduce_fusion_backend")
    resolved: str | None = None
    if chosen is not None:
        try:
            resolved = fusion._resolve_backend(chosen, nodes > 1)
        except ValueError as exc:
            resolved = f"error: {exc}"
    decisions = [msg for _, msg in logs.lines if "SM12x" in msg]
    # G7's decision line ("sm120fork all-reduce at TP2: ... (policy ..., measured ...)")
    notes = [msg for _, msg in logs.lines if "AllReduce Fusion" in msg or "allreduce" in msg
             or msg.startswith("sm120fork all-reduce")]
    return {
        "observed": {"backend": chosen, "runs": None if resolved is None or
                     resolved.startswith("error") else resolved,
                     "sm12x_log_lines": len(decisions)},
        "detail": " | ".join(notes + ([resolved] if resolved and resolved.startswith("error")
                                      else [])),
    }


def run_auto() -> list[Observation]:
    return [{"name": name, **_auto_case(**params)} for name, params in auto_scenarios()]


def run_applies() -> list[Observation]:
    context = _module("sglang.srt.runtime_context").get_context()
    add_norm = _module("sglang.srt.layers.layer_boundary.residual.add_norm")
    results = []
    for backend in (None, "trtllm"):
        for batch in (16, 2049):
            with context.override_server_args(flashinfer_allreduce_fusion_backend=backend,
                                              tp_size=2):
                applies = bool(add_norm.flashinfer_ar_fusion_applies(batch))
            results.append({"name": f"backend={backend} batch{batch}", "observed": applies,
                            "detail": ""})
    return results


def run_plain() -> list[Observation]:
    context = _module("sglang.srt.runtime_context").get_context()
    bootstrap = _module("sglang.srt.distributed.bootstrap")
    parallel_state = _module("sglang.srt.distributed.parallel_state")
    results = []
    for backend in (None, "trtllm"):
        for env in (None, "0", "off", "1", "on", "maybe"):
            name = f"backend={backend}" + (f" {PLAIN_ENV}={env}" if env is not None else "")
            parallel_state.set_flashinfer_allreduce_only(False)
            with context.override_server_args(flashinfer_allreduce_fusion_backend=backend,
                                              tp_size=2), environ(PLAIN_ENV, env), \
                    captured_logs("sglang.srt.distributed.bootstrap") as logs:
                try:
                    bootstrap._set_all_reduce_flags()
                except ValueError as exc:
                    results.append({"name": name, **_error(exc)})
                    continue
            lines = [msg for _, msg in logs.lines if "SM12x" in msg]
            results.append({
                "name": name,
                "observed": {"flashinfer_plain_allreduce":
                             bool(parallel_state._ENABLE_FLASHINFER_ALLREDUCE_ONLY),
                             "sm12x_log_lines": len(lines)},
                "detail": " | ".join(lines),
            })
    return results


class _FakeDriver:
    """``cuda.bindings.driver`` as the preflight sizing uses it; without ``multicast`` it
    rejects cuMulticastGetGranularity, as PCIe GPUs do."""

    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_NOT_SUPPORTED=801)
    CUdevice_attribute = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED=132)
    CUmemAllocationGranularity_flags = types.SimpleNamespace(
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)
    CUmulticastGranularity_flags = types.SimpleNamespace(CU_MULTICAST_GRANULARITY_RECOMMENDED=1)

    def __init__(self, *, multicast: bool, multicast_granularity: int) -> None:
        self.multicast = multicast
        self.multicast_granularity = multicast_granularity
        self.multicast_queries = 0

    def cuDeviceGetAttribute(self, attribute: int, device: int) -> tuple[int, int]:  # noqa: N802
        return self.CUresult.CUDA_SUCCESS, int(self.multicast)

    def cuMemGetAllocationGranularity(self, prop: Any, flags: int) -> tuple[int, int]:  # noqa: N802
        return self.CUresult.CUDA_SUCCESS, ALLOC_GRANULARITY

    def CUmulticastObjectProp(self) -> Any:  # noqa: N802
        return types.SimpleNamespace()

    def cuMulticastGetGranularity(self, prop: Any, flags: int) -> tuple[int, int]:  # noqa: N802
        self.multicast_queries += 1
        if not self.multicast:
            return self.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0
        return self.CUresult.CUDA_SUCCESS, self.multicast_granularity


def run_preflight() -> list[Observation]:
    torch = _module("torch")
    fusion = _module("sglang.srt.layers.flashinfer_comm_fusion")
    prop = types.SimpleNamespace(requestedHandleTypes=1,
                                 location=types.SimpleNamespace(id=0))
    devices = {
        "no multicast": (False, MULTICAST_GRANULARITY),
        "multicast": (True, MULTICAST_GRANULARITY),
        "multicast at allocation granularity": (True, ALLOC_GRANULARITY),
    }
    results = []
    for name, (multicast, granularity) in devices.items():
        driver = _FakeDriver(multicast=multicast, multicast_granularity=granularity)
        try:
            sizes = fusion._flashinfer_trtllm_workspace_allocation_sizes(
                driver, prop, 2, 2048, 7168, torch.bfloat16)
        except RuntimeError as exc:
            results.append({"name": name, **_error(exc)})
            continue
        results.append({"name": name,
                        "observed": {"sizes": [int(s) for s in sizes],
                                     "multicast_queried": driver.multicast_queries > 0},
                        "detail": ""})
    return results


SUITES: dict[str, Callable[[], list[Observation]]] = {
    "resolve": run_resolve,
    "auto": run_auto,
    "applies": run_applies,
    "plain": run_plain,
    "preflight": run_preflight,
}


def main(argv: Sequence[str]) -> int:
    request = json.loads(argv[0])
    start_probe(request["capability"])
    return emit([{**obs, "name": f"{suite}: {obs['name']}"}
                 for suite in request["suites"] for obs in SUITES[suite]()])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
