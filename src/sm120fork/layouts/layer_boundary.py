"""Layout ``layer_boundary`` (SGLang 0.5.23): the fused-norm gate is
``sglang.srt.layers.layer_boundary.residual.add_norm.flashinfer_ar_fusion_applies``,
server settings and TP groups live in ``sglang.srt.runtime_context``, and the backend is
resolved by ``flashinfer_comm_fusion._resolve_backend``.

Its probe (``python -m sm120fork.layouts.layer_boundary '<json request>'`` beside the tree
under test, SGLang's own code with only the GPU and CUDA driver bindings faked) observes;
:func:`check` judges G1-G5 (patches/README.md) on a CPU: on 8.0/9.0/10.0 every observation
equals the unpatched baseline's.  Its newer packages go into an overlay first on the
probe's path (:func:`ensure_overlay`).  :func:`setup` serves the GPU layer harness's ranks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sm120fork.errors import CommandError, VerifyError
from sm120fork.harness import fake_gpu
from sm120fork.harness.fake_gpu import Records, _module, emit, environ, start_probe
from sm120fork.layouts import FUSION_MODULE, RAISED_ALONE_SAYS, Layer  # noqa: F401
from sm120fork.layouts import results as shared
from sm120fork.layouts.results import CheckResult, Observation, judged, setting_in
from sm120fork.util import proc
from sm120fork.util.files import made_once

PROBE_MODULE = "sm120fork.layouts.layer_boundary"
#: What the probe and SGLang's CPU unit tests (as ``upstream_pr`` runs them) need beyond the
#: sglang-probe dependency group to import sglang 0.5.23's modules on a CPU machine: sglang
#: 0.5.23's own pins, installed with --no-deps into an overlay first on the PYTHONPATH, so
#: they shadow the communicator probe's; tvm_ffi (sglang.test.test_utils reaches it) at the
#: proof group's pin, its CPU build.
OVERLAY_REQUIREMENTS = (
    "transformers==5.19.0", "tokenizers==0.23.2", "msgspec==0.23.0", "nvidia-ml-py==13.615.71",
    "fastapi==0.165.0", "uvicorn==0.54.0", "opentelemetry-api==1.45.2",
    "apache-tvm-ffi==0.1.15.post2")
SM12X = ("12.0", "12.1")
UNCHANGED = ("8.0", "9.0", "10.0")
AUTO_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
PLAIN_ENV = "SGLANG_SM120_FLASHINFER_PLAIN_ALLREDUCE"
PREFLIGHT_BASELINE = "9.0"
GATE = {"resolve": "G1", "auto": "G2", "applies": "G3", "preflight": "G4", "plain": "G5"}


def ensure_overlay(cache_dir: Path, *,
                   python: str | os.PathLike[str] = sys.executable) -> Path:
    digest = hashlib.sha256("\n".join(OVERLAY_REQUIREMENTS).encode()).hexdigest()[:16]

    def install(target: Path) -> None:
        try:
            proc.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target",
                      str(target), *OVERLAY_REQUIREMENTS])
        except CommandError as exc:
            raise VerifyError("installing the layer_boundary probe overlay failed",
                              where=f"{__name__}.OVERLAY_REQUIREMENTS", detail=exc.detail,
                              fix="check the package index is reachable") from exc

    return made_once(cache_dir / f"overlay-{digest}", digest, install)


def probe_path(cache: Path, python: str | os.PathLike[str]) -> list[str]:
    return [str(ensure_overlay(cache, python=python))]


def expected_sm12x(name: str) -> Any:
    suite, _, scenario = name.partition(": ")
    words = scenario.split()
    if suite == "resolve":
        backend, nodes = words[0], words[1]
        return "trtllm" if backend in ("auto", "trtllm") and nodes == "nodes1" else "error"
    if suite == "auto":
        return _expected_auto(scenario)
    if suite == "applies":
        return scenario == "backend=trtllm batch16"
    if suite == "plain":
        if scenario.startswith("backend=None"):
            return {"flashinfer_plain_allreduce": False, "sm12x_log_lines": 0}
        env = setting_in(scenario, PLAIN_ENV)
        if env not in (None, "0", "off", "1", "on"):
            return "error"
        return {"flashinfer_plain_allreduce": env in ("1", "on"), "sm12x_log_lines": 1}
    raise KeyError(name)


def _expected_auto(scenario: str) -> Any:
    words = scenario.split()
    off = {"backend": None, "runs": None, "sm12x_log_lines": 1}
    if scenario.startswith("enforce-disable"):
        return off
    if scenario.startswith("explicit-trtllm"):
        return {"backend": "trtllm", "runs": "trtllm", "sm12x_log_lines": 1}
    tp, nodes = int(words[1].removeprefix("tp")), words[2]
    env = setting_in(scenario, AUTO_ENV)
    if env not in (None, "0", "off", "1", "on"):
        return "error"
    on = {"backend": "auto", "runs": "trtllm", "sm12x_log_lines": 1}
    if nodes != "nodes1" or tp < 2 or env in ("0", "off"):
        return off
    return on if env in ("1", "on") or tp == 2 else off


def judge(observed: Mapping[tuple[str, str], Sequence[Observation]]) -> list[CheckResult]:
    results: list[CheckResult] = []
    for cap in SM12X + UNCHANGED:
        sm12x = cap in SM12X
        # The preflight sizing does not depend on the capability: one baseline serves SM12x.
        baseline = {o.name: o for o in observed["baseline", PREFLIGHT_BASELINE if sm12x else cap]}
        for obs in observed["patched", cap]:
            suite = obs.name.partition(": ")[0]
            if not sm12x and obs.name not in baseline:
                raise VerifyError(f"the baseline probe has no observation {obs.name!r}",
                                  fix="run both trees with the same probe")
            if suite == "preflight":
                # G4 is not SM12x-only: any GPU without multicast (H100 PCIe too) gains.
                results.append(_preflight_check(obs.name, cap, obs, baseline))
            elif sm12x:
                expected = expected_sm12x(obs.name)
                # A refusal on SM12x must say why in SM12x terms, not "requires SM90".
                needs = "SM12x" if suite == "resolve" and expected == "error" else ""
                results.append(judged(obs, expected, cap, GATE[suite], require_in_detail=needs))
            else:
                results.append(judged(obs, baseline[obs.name].observed, cap, "unchanged",
                                      note="(expected = unpatched upstream)"))
    return results


def _preflight_check(name: str, cap: str, obs: Observation,
                     baseline: Mapping[str, Observation]) -> CheckResult:
    """Without multicast: upstream's sizes at allocation granularity, never asking for mc."""
    scenario = name.partition(": ")[2]
    upstream = shared.compact(baseline[name].observed)
    if scenario == "no multicast":
        reference = baseline["preflight: multicast at allocation granularity"].observed
        expected: object = {"multicast_queried": False, "sizes": reference.get("sizes")
                            if isinstance(reference, dict) else None}
        note = (f"(expected sizes = upstream's when multicast granularity equals allocation "
                f"granularity; unpatched upstream here: {upstream})")
    else:
        expected = baseline[name].observed
        note = "(expected = unpatched upstream)"
    return judged(obs, expected, cap, "G4", note=note)


def check(tree: Path, *, baseline: Path | None, python: str | os.PathLike[str],
          cache: Path, layer: shared.LayerRunner) -> list[CheckResult]:
    """``tree`` against ``baseline`` (unpatched upstream); a probe that cannot run raises.
    (The G series has no two-rank layer cases: ``layer`` is unused.)"""
    if baseline is None:
        raise VerifyError("the layer_boundary checks compare with unpatched upstream",
                          where=str(tree), fix="pass the unpatched tree as baseline")
    shared.sglang_trees(tree, baseline)
    overlay = ensure_overlay(cache, python=python)

    def probe(root: Path, cap: str) -> Callable[[], list[Observation]]:
        # The fork tree stays clean.  Not PYTHONPYCACHEPREFIX: installed modules' byte code
        # would go unread (25 s of CPU a probe instead of 11).
        return functools.partial(
            shared.run_probe, PROBE_MODULE, {"capability": [int(p) for p in cap.split(".")],
                                             "suites": list(SUITES)},
            tree=root, path=[overlay, root / "python"], env={"PYTHONDONTWRITEBYTECODE": "1"},
            python=python, timeout=600, what=f"the layer_boundary probe (capability {cap})",
            fix="install the probe's requirements and its overlay")

    return judge(shared.gather({**{("patched", cap): probe(tree, cap) for cap in SM12X + UNCHANGED},
                                **{("baseline", cap): probe(baseline, cap) for cap in UNCHANGED}}))


ADD_NORM = "sglang.srt.layers.layer_boundary.residual.add_norm"
#: What the one fallback warning must say (upstream's own words).
WARNING_SAYS = "Disabling flashinfer allreduce fusion permanently"


def setup(group: Any) -> Layer:
    """Server args and TP groups on ``group``; autotuning off (the pcie_ipc communicator
    would time its kernels on a GPU the ranks share)."""
    rc = _module("sglang.srt.runtime_context")
    rc.get_context().override_server_args(
        flashinfer_allreduce_fusion_backend="trtllm", tp_size=group.world_size,
        disable_flashinfer_autotune=True).install()
    rc.get_parallel().override_permanently(
        tp_size=group.world_size, tp_rank=group.rank, attn_tp_size=group.world_size,
        attn_tp_rank=group.rank, tp_group=group, attn_tp_group=group)
    return Layer.of("layer_boundary", ADD_NORM, "flashinfer_ar_fusion_applies")


def patch_gates_in_memory(layer: Layer) -> None:
    """Stock upstream only: its gates accept SM12x, as the G1/G3 patches make them."""
    fusion = layer.fusion
    add_norm: Any = _module(ADD_NORM)
    real_resolve = fusion._resolve_backend

    def resolve(backend: str, is_multi_node: bool = False) -> str:
        if backend in ("trtllm", "auto") and not is_multi_node:
            return "trtllm"
        return str(real_resolve(backend, is_multi_node))

    fusion._resolve_backend = resolve
    add_norm._is_sm90_supported = True


def use_fake_flashinfer(fusion: Any, create: Any) -> None:
    """The CPU stand-in bound as this module's import would bind FlashInfer, with a
    cuMemCreate preflight that succeeds (the vote over the ranks stays SGLang's)."""
    fusion._create_allreduce_fusion_workspace = create
    fusion._flashinfer_create_workspace_supports_comm_backend = True
    fusion._flashinfer_create_workspace_supports_group = True
    fusion.get_cuda_driver_bindings = lambda: None
    fusion._make_flashinfer_workspace_allocation_prop = lambda driver: None
    fusion._flashinfer_trtllm_workspace_allocation_sizes = lambda *args: [1 << 21]
    fusion._probe_cumem_create_sequence = lambda *args: True


#: The model that motivated the work (61 layers, hidden 7168), on upstream's fusion list.
FUSION_MODEL_ARCH = "KimiK25ForConditionalGeneration"
BACKENDS = ("auto", "trtllm", "mnnvl", "cutedsl")
#: Granularities the fake driver reports (bytes).
ALLOC_GRANULARITY = 2 << 20
MULTICAST_GRANULARITY = 64 << 20


def _error(exc: Exception) -> fake_gpu.Observation:
    return {"observed": "error", "detail": f"{type(exc).__name__}: {exc}"}


def _observed(name: str, error: type[Exception], observe: Callable[..., object],
              *args: object) -> fake_gpu.Observation:
    """``observe(*args)`` as the observation ``name``, or the ``error`` it raised."""
    try:
        return {"name": name, "observed": observe(*args), "detail": ""}
    except error as exc:
        return {"name": name, **_error(exc)}


def run_resolve() -> list[fake_gpu.Observation]:
    fusion = _module(FUSION_MODULE)
    return [_observed(f"{backend} nodes{nodes}", ValueError, fusion._resolve_backend, backend,
                      nodes > 1) for backend in BACKENDS for nodes in (1, 2)]


def auto_scenarios() -> list[str]:
    """Each case's name says its settings (:func:`_auto_named` reads them back)."""
    return [
        *(f"auto tp{tp} nodes{nodes}" for nodes in (1, 2) for tp in (1, 2, 4, 8)),
        *(f"auto tp{tp} nodes1 {AUTO_ENV}={env}" for env in ("0", "off", "1", "on")
          for tp in (2, 4, 8)),
        f"auto tp2 nodes2 {AUTO_ENV}=1",
        f"auto tp2 nodes1 {AUTO_ENV}=maybe",
        *(f"explicit-trtllm tp{tp} nodes1" for tp in (2, 4, 8)),
        "enforce-disable auto tp2 nodes1",
        "enforce-disable explicit-trtllm tp4 nodes1",
    ]


def _auto_named(name: str) -> fake_gpu.Observation:
    return _auto_case(tp=shared.number_in(name, "tp"), nodes=shared.number_in(name, "nodes"),
                      env=setting_in(name, AUTO_ENV),
                      backend="trtllm" if "explicit-trtllm" in name else None,
                      enforce_disable=name.startswith("enforce-disable"))


def _auto_case(*, tp: int, nodes: int, env: str | None = None, backend: str | None = None,
               enforce_disable: bool = False) -> fake_gpu.Observation:
    msgspec = _module("msgspec")
    torch = _module("torch")
    overrides = _module("sglang.srt.arg_groups.overrides")
    fusion = _module(FUSION_MODULE)
    ServerArgs = _module("sglang.srt.server_args").ServerArgs  # noqa: N806

    args = ServerArgs(model_path="sm120fork/probe-model", tp_size=tp, nnodes=nodes,
                      flashinfer_allreduce_fusion_backend=backend,
                      enforce_disable_flashinfer_allreduce_fusion=enforce_disable)
    # model_config_of() hands a fixture's configuration back as it is (no download).
    hf_config = types.SimpleNamespace(architectures=[FUSION_MODEL_ARCH], model_type="kimi_k25")
    msgspec.Struct.__setattr__(args, "_model_config", types.SimpleNamespace(
        hf_config=hf_config, dtype=torch.bfloat16))
    with environ(AUTO_ENV, env), Records("sglang.srt.arg_groups.overrides") as logs:
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
    decisions = [msg for msg in logs.lines if "SM12x" in msg]
    # G7's decision line ("sm120fork all-reduce at TP2: ... (policy ..., measured ...)")
    notes = [msg for msg in logs.lines if "AllReduce Fusion" in msg or "allreduce" in msg
             or msg.startswith("sm120fork all-reduce")]
    return {
        "observed": {"backend": chosen, "runs": None if resolved is None or
                     resolved.startswith("error") else resolved,
                     "sm12x_log_lines": len(decisions)},
        "detail": " | ".join(notes + ([resolved] if resolved and resolved.startswith("error")
                                      else [])),
    }


def run_applies() -> list[fake_gpu.Observation]:
    context = _module("sglang.srt.runtime_context").get_context()
    add_norm = _module(ADD_NORM)
    results = []
    for backend in (None, "trtllm"):
        for batch in (16, 2049):
            with context.override_server_args(flashinfer_allreduce_fusion_backend=backend,
                                              tp_size=2):
                applies = bool(add_norm.flashinfer_ar_fusion_applies(batch))
            results.append({"name": f"backend={backend} batch{batch}", "observed": applies,
                            "detail": ""})
    return results


def run_plain() -> list[fake_gpu.Observation]:
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
                    Records("sglang.srt.distributed.bootstrap") as logs:
                try:
                    bootstrap._set_all_reduce_flags()
                except ValueError as exc:
                    results.append({"name": name, **_error(exc)})
                    continue
            lines = [msg for msg in logs.lines if "SM12x" in msg]
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


def run_preflight() -> list[fake_gpu.Observation]:
    torch = _module("torch")
    fusion = _module(FUSION_MODULE)
    prop = types.SimpleNamespace(requestedHandleTypes=1,
                                 location=types.SimpleNamespace(id=0))
    devices = {
        "no multicast": (False, MULTICAST_GRANULARITY),
        "multicast": (True, MULTICAST_GRANULARITY),
        "multicast at allocation granularity": (True, ALLOC_GRANULARITY),
    }

    def sizes(multicast: bool, granularity: int) -> object:
        driver = _FakeDriver(multicast=multicast, multicast_granularity=granularity)
        found = fusion._flashinfer_trtllm_workspace_allocation_sizes(
            driver, prop, 2, 2048, 7168, torch.bfloat16)
        return {"sizes": [int(s) for s in found],
                "multicast_queried": driver.multicast_queries > 0}

    return [_observed(name, RuntimeError, sizes, *device) for name, device in devices.items()]


SUITES: dict[str, Callable[[], list[fake_gpu.Observation]]] = {
    "resolve": run_resolve,
    "auto": lambda: [{"name": name, **_auto_named(name)} for name in auto_scenarios()],
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
