"""Layout ``communicator`` (SGLang 0.5.10): the fused-norm gate is
``sglang.srt.layers.communicator.apply_flashinfer_allreduce_fusion``, server settings are a
``ServerArgs`` set with ``set_global_server_args_for_scheduler``, and the TP groups are
module globals of ``distributed.parallel_state``.

Its probe (``python -m sm120fork.layouts.communicator '<json request>'`` beside the tree
under test, the tree's real modules with only the GPU faked) observes; :func:`check` judges
S1-S4 of a patched tree on a CPU, one interpreter per capability (on 8.0/9.0/10.0 the
decisions equal unpatched upstream's); :func:`setup` serves the GPU layer harness's ranks.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from sm120fork.harness import fake_gpu
from sm120fork.harness.fake_gpu import Records, _module, emit, environ, start_probe
from sm120fork.layouts import (  # noqa: F401
    FUSION_MODULE,
    RAISED_ALONE_SAYS,
    CaseOutcome,
    Layer,
    defaults,
)
from sm120fork.layouts import results as shared
from sm120fork.layouts.results import CheckResult, Observation, judged, number_in, setting_in

PROBE_MODULE = "sm120fork.layouts.communicator"

SM12X = ("12.0", "12.1")
UNCHANGED = ("8.0", "9.0", "10.0")
SM120_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"

ON = {"flag": True, "fused": True}
OFF = {"flag": False, "fused": False}
FLAG_ONLY = {"flag": True, "fused": False}
#: The CUDA below which FlashInfer cannot build for SM12x (S1/S2 gate on it).
OLD_CUDA = "12.8"
#: S4's two-rank cases (gpu.layer.run on the CPU), each judged there.
TOGETHER_CASES = ("fused", "all-ranks-create-fails", "one-rank-create-fails",
                  "one-rank-fails-midway", "one-rank-fails-late", "fused-call-raises",
                  "no-p2p", "one-rank-fails-in-fd-exchange")
#: S4's bound on FlashInfer's fd-socket receive (the tree's own: 30 s).
EXCHANGE_TIMEOUT_S = 3.0


def _logged(decision: dict[str, bool]) -> dict[str, bool | int]:
    return {**decision, "sm12x_lines": 1}


def expected_sm12x(scenario: str, *, buildable: bool = True) -> Any:
    """What the series promises on SM12x (not ``buildable``: CUDA too old, fusion off)."""
    env = setting_in(scenario, SM120_ENV)
    if env is not None and env not in ("0", "off", "1", "on"):
        return "error"
    if not buildable or scenario.startswith("enforce-disable"):
        return _logged(OFF)
    if scenario.startswith("explicit-flag"):
        return _logged(ON)
    if env is None:
        return _logged(ON if number_in(scenario, "tp") == 2 else OFF)
    return _logged(OFF if env in ("0", "off") else ON)


def expected_upstream(capability: str, scenario: str) -> Any:
    """How unpatched upstream 0.5.10.post1 decides (no env var)."""
    quiet = {"sm12x_lines": 0}
    if scenario.startswith("enforce-disable"):
        return {**OFF, **quiet}
    fusion_arch = capability in ("9.0", "10.0")
    if scenario.startswith("explicit-flag"):
        return {**(ON if fusion_arch else FLAG_ONLY), **quiet}
    return {**(ON if fusion_arch and number_in(scenario, "tp") > 1 else OFF), **quiet}


#: The probe's "fallbacks" suite, run at 12.0: case -> (patch ID, expected observation).
FALLBACKS: dict[str, tuple[str, Any]] = {
    "fused call returns None": ("S3", {"attention_tp_all_reduce_calls": 1,
                                       "tp_all_reduce_calls": 0, "matches_reference": True}),
}


def probe_path(cache: Path, python: str | os.PathLike[str]) -> list[str]:
    return []


def _decision_prefix(scenario: str) -> str:
    return "S1" if scenario.startswith("explicit-flag") else "S2"


def check(tree: Path, *, baseline: Path | None, layer: shared.LayerRunner,
          python: str | os.PathLike[str] = sys.executable, cache: Path | None = None,
          jobs: int | None = None, timeout: float = 600) -> list[CheckResult]:
    """Without ``baseline`` 8.0/9.0/10.0 are compared with upstream's known decisions; a
    behaviour that differs is a failed result, a probe that cannot run ``VerifyError``.
    (``cache`` is unused: this layout needs no overlay.)"""
    shared.sglang_trees(tree, baseline)

    def probe(root: Path, suite: str, cap: str, cuda: str = "12.9") -> Callable[[], object]:
        return functools.partial(
            shared.run_probe, PROBE_MODULE, {"suite": suite, "cuda": cuda,
                                             "capability": [int(p) for p in cap.split(".")]},
            tree=root, path=[root / "python"], env={}, python=python, timeout=timeout,
            what=f"the SGLang probe ({suite}, capability {cap})",
            fix=f"install the probe's requirements: {shared.REQUIREMENTS}")

    work: dict[tuple[str, str], Callable[[], object]] = {
        **{("patched", cap): probe(tree, "decisions", cap) for cap in SM12X + UNCHANGED},
        **{("baseline", cap): probe(baseline, "decisions", cap)
           for cap in UNCHANGED if baseline is not None},
        ("old cuda", "12.0"): probe(tree, "decisions", "12.0", OLD_CUDA),
        ("fallbacks", "12.0"): probe(tree, "fallbacks", "12.0"),
        **{("S4", case): functools.partial(
            layer, case, sglang_path=tree / "python", layout="communicator", python=python,
            device="cpu", tokens=(3, 16), timeout=30, start_timeout=timeout,
            exchange_timeout_s=EXCHANGE_TIMEOUT_S) for case in TOGETHER_CASES}}
    done = shared.gather(work, jobs)
    observed: dict[tuple[str, str], list[Observation]] = {
        key: value for key, value in done.items() if isinstance(value, list)}

    results: list[CheckResult] = []
    for cap in SM12X:
        results += [judged(obs, expected_sm12x(obs.name), cap, _decision_prefix(obs.name))
                    for obs in observed["patched", cap]]
    for cap in UNCHANGED:
        if baseline is not None:
            upstream = {o.name: o.observed for o in observed["baseline", cap]}
            note = "(expected = unpatched upstream tree)"
        else:
            upstream = {o.name: expected_upstream(cap, o.name) for o in observed["patched", cap]}
            note = "(expected = upstream 0.5.10.post1 decisions, no baseline tree)"
        results += [judged(obs, upstream[obs.name], cap, "unchanged", note=note)
                    for obs in observed["patched", cap]]
    results += [judged(obs, expected_sm12x(obs.name, buildable=False),
                       f"12.0 CUDA {OLD_CUDA}", _decision_prefix(obs.name))
                for obs in observed["old cuda", "12.0"]]
    for obs in observed["fallbacks", "12.0"]:
        check_id, expect = FALLBACKS[obs.name]
        results.append(judged(obs, expect, "12.0", check_id))
    return results + [_together_result(key[1], outcome) for key, outcome in done.items()
                      if isinstance(outcome, CaseOutcome)]


def _together_result(case: str, outcome: CaseOutcome) -> CheckResult:
    observed = [{
        "paths": sorted({s.path for s in obs.steps}),
        "correct": all(s.correct for s in obs.steps),
        "warnings": len(obs.warnings),
        "fusion_after": obs.gate_after,
    } for obs in outcome.ranks]
    fused = case == "fused"
    expected = [{"paths": ["fused"] if fused else ["fallback", "unfused"], "correct": True,
                 "warnings": 0 if fused else 1, "fusion_after": fused}] * 2
    warnings = [obs.warnings[0] for obs in outcome.ranks if obs.warnings]
    detail = " | ".join([*outcome.problems, *warnings[:1]])
    return CheckResult(name=f"S4 two ranks: {case}", capability="12.0",
                       expected=shared.compact(expected),
                       observed=shared.compact(observed) if not outcome.hung else '"hung"',
                       passed=outcome.passed and observed == expected, detail=detail)


#: What the one fallback warning must say: S4's own words (this layout's series).
WARNING_SAYS = "unfused path"


def setup(group: Any) -> Layer:
    ps = _module("sglang.srt.distributed.parallel_state")
    for name in ("_TP", "_ATTN_TP", "_MOE_TP"):
        setattr(ps, name, group)
    sa = _module("sglang.srt.server_args")
    args = defaults(sa.ServerArgs)
    args.tp_size = group.world_size
    args.enable_flashinfer_allreduce_fusion = True
    sa.set_global_server_args_for_scheduler(args)
    return Layer.of("communicator", "sglang.srt.layers.communicator",
                    "apply_flashinfer_allreduce_fusion")


def patch_gates_in_memory(layer: Layer) -> None:
    raise ValueError("layout communicator has no in-memory gate patch: run a patched tree")


#: One of the model architectures upstream auto-enables the fusion for.
FUSION_MODEL_ARCH = "Qwen3MoeForCausalLM"
BATCH = 16


def _decide(*, tp: int, explicit: bool = False, env: str | None = None,
            enforce_disable: bool = False) -> fake_gpu.Observation:
    sa = _module("sglang.srt.server_args")
    communicator = _module("sglang.srt.layers.communicator")

    args = defaults(sa.ServerArgs)
    args.model_path = "sm120fork/probe-model"
    args.tp_size = tp
    args.enable_flashinfer_allreduce_fusion = explicit
    args.enforce_disable_flashinfer_allreduce_fusion = enforce_disable
    hf_config = types.SimpleNamespace(architectures=[FUSION_MODEL_ARCH])
    args.get_model_config = lambda: types.SimpleNamespace(hf_config=hf_config)
    with environ(SM120_ENV, env), Records("sglang.srt.server_args") as logs:
        try:
            sa.ServerArgs._handle_model_specific_adjustments(args)
        except ValueError as exc:
            return {"observed": "error", "detail": str(exc)}
    sa.set_global_server_args_for_scheduler(args)
    fused = bool(communicator.apply_flashinfer_allreduce_fusion(BATCH))
    flag = bool(args.enable_flashinfer_allreduce_fusion)
    notes = [msg for msg in logs.lines if "AllReduce Fusion" in msg or "allreduce" in msg]
    sm12x_lines = sum("on SM12x" in msg for msg in logs.lines)
    return {"observed": {"flag": flag, "fused": fused, "sm12x_lines": sm12x_lines},
            "detail": " | ".join(notes)}


def decision_scenarios() -> list[str]:
    """Each case's name says its settings (:func:`_decide_named` reads them back)."""
    return [
        *(f"explicit-flag tp{tp}" for tp in (2, 4, 8)),
        *(f"auto tp{tp}" for tp in (1, 2, 4, 8)),
        *(f"auto tp{tp} {SM120_ENV}={env}" for env in ("0", "off", "1", "on") for tp in (2, 4, 8)),
        f"auto tp2 {SM120_ENV}=maybe",
        "enforce-disable auto tp2",
        "enforce-disable explicit tp4",
    ]


def _decide_named(name: str) -> fake_gpu.Observation:
    return _decide(tp=number_in(name, "tp"), explicit="explicit" in name,
                   env=setting_in(name, SM120_ENV),
                   enforce_disable=name.startswith("enforce-disable"))


def _fallback_case() -> fake_gpu.Observation:
    """A fused norm whose fused call yields None (no workspace) must all-reduce (a recorder
    adding a fixed "peer" sum), then add and norm."""
    torch = _module("torch")
    dist = _module("sglang.srt.distributed")
    fusion = _module(FUSION_MODULE)
    RMSNorm = _module("sglang.srt.layers.layernorm").RMSNorm  # noqa: N806

    hidden, tokens, eps = 64, 3, 1e-6
    gen = torch.Generator().manual_seed(120)
    x, peer, residual = (torch.randn(tokens, hidden, generator=gen) for _ in range(3))
    norm = RMSNorm(hidden, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=gen) + 0.5)
    # The CUDA kernel behind forward_cuda does not exist on a CPU; forward_native is
    # the same norm in plain torch.  The code under test is the fallback around it.
    norm._forward_method = norm.forward_native

    calls: list[tuple[int, ...]] = []
    tp_calls: list[tuple[int, ...]] = []

    def attention_all_reduce(tensor: Any) -> Any:
        calls.append(tuple(tensor.shape))
        return tensor + peer

    def tp_all_reduce(tensor: Any) -> Any:  # a TP group wider than the attention group
        tp_calls.append(tuple(tensor.shape))
        return tensor + 2 * peer

    # create=True: upstream's tree lacks some of them
    all_reduces = mock.patch.multiple(
        dist, create=True, attention_tensor_model_parallel_all_reduce=attention_all_reduce,
        tensor_model_parallel_all_reduce=tp_all_reduce,
        get_attn_tensor_model_parallel_world_size=lambda: 2)
    no_fused = mock.patch.multiple(fusion, create=True,
                                   flashinfer_allreduce_residual_rmsnorm=lambda **_: (None, None))
    with torch.no_grad(), all_reduces, no_fused:
        out, residual_out = norm.forward_with_allreduce_fusion(
            x.clone(), residual.clone(), use_attn_tp_group=True
        )
        # the reference: all-reduced x + residual, then RMSNorm, in float64
        want_residual = (x + peer).double() + residual.double()
        want_out = want_residual * (want_residual.pow(2).mean(dim=-1, keepdim=True)
                                    + eps).rsqrt() * norm.weight.double()
        matches = all(bool(torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5))
                      for got, want in ((out, want_out), (residual_out, want_residual)))
        max_err = float((out.double() - want_out).abs().max())
    return {
        "observed": {"attention_tp_all_reduce_calls": len(calls),
                     "tp_all_reduce_calls": len(tp_calls), "matches_reference": matches},
        "detail": f"all-reduce over the attention TP group called with {calls}, over the "
                  f"TP group with {tp_calls}; max |norm - reference| = {max_err:.3g}",
    }


SUITES: dict[str, Callable[[], list[fake_gpu.Observation]]] = {
    "decisions": lambda: [{"name": name, **_decide_named(name)} for name in decision_scenarios()],
    "fallbacks": lambda: [{"name": "fused call returns None", **_fallback_case()}],
}


def main(argv: Sequence[str]) -> int:
    request = json.loads(argv[0])
    start_probe(request["capability"], cuda_version=str(request.get("cuda", "12.9")))
    return emit(SUITES[request["suite"]]())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
