"""Probe of layout ``communicator``: ``python -m ... '<json request>'`` beside the tree
under test, its modules real and only the GPU faked; it observes, ``checks`` judges."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, TypedDict
from unittest import mock

from sm120fork.harness.fake_gpu import (
    Observation,
    _module,
    captured_logs,
    emit,
    environ,
    start_probe,
)
from sm120fork.layouts import defaults

#: One of the model architectures upstream auto-enables the fusion for.
FUSION_MODEL_ARCH = "Qwen3MoeForCausalLM"
SM120_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
BATCH = 16


def _server_args(**overrides: Any) -> Any:
    args = defaults(_module("sglang.srt.server_args").ServerArgs)
    args.model_path = "sm120fork/probe-model"
    for key, value in overrides.items():
        setattr(args, key, value)
    hf_config = types.SimpleNamespace(architectures=[FUSION_MODEL_ARCH])
    args.get_model_config = lambda: types.SimpleNamespace(hf_config=hf_config)
    return args


def _decide(*, tp: int, explicit: bool = False, env: str | None = None,
            enforce_disable: bool = False) -> Observation:
    sa = _module("sglang.srt.server_args")
    communicator = _module("sglang.srt.layers.communicator")

    args = _server_args(
        tp_size=tp,
        enable_flashinfer_allreduce_fusion=explicit,
        enforce_disable_flashinfer_allreduce_fusion=enforce_disable,
    )
    with environ(SM120_ENV, env), captured_logs("sglang.srt.server_args") as logs:
        try:
            sa.ServerArgs._handle_model_specific_adjustments(args)
        except ValueError as exc:
            return {"observed": "error", "detail": str(exc)}
    sa.set_global_server_args_for_scheduler(args)
    fused = bool(communicator.apply_flashinfer_allreduce_fusion(BATCH))
    flag = bool(args.enable_flashinfer_allreduce_fusion)
    notes = [msg for _, msg in logs.lines if "AllReduce Fusion" in msg or "allreduce" in msg]
    sm12x_lines = sum("on SM12x" in msg for _, msg in logs.lines)
    return {"observed": {"flag": flag, "fused": fused, "sm12x_lines": sm12x_lines},
            "detail": " | ".join(notes)}


class Decision(TypedDict):
    tp: int
    explicit: NotRequired[bool]
    env: NotRequired[str]
    enforce_disable: NotRequired[bool]


def decision_scenarios() -> list[tuple[str, Decision]]:
    scenarios: list[tuple[str, Decision]] = []
    for tp in (2, 4, 8):
        scenarios.append((f"explicit-flag tp{tp}", {"tp": tp, "explicit": True}))
    for tp in (1, 2, 4, 8):
        scenarios.append((f"auto tp{tp}", {"tp": tp}))
    for env in ("0", "off", "1", "on"):
        for tp in (2, 4, 8):
            scenarios.append((f"auto tp{tp} {SM120_ENV}={env}", {"tp": tp, "env": env}))
    scenarios.append((f"auto tp2 {SM120_ENV}=maybe", {"tp": 2, "env": "maybe"}))
    scenarios.append(("enforce-disable auto tp2", {"tp": 2, "enforce_disable": True}))
    scenarios.append(
        ("enforce-disable explicit tp4", {"tp": 4, "explicit": True, "enforce_disable": True})
    )
    return scenarios


def run_decisions() -> list[Observation]:
    return [{"name": name, **_decide(**params)} for name, params in decision_scenarios()]


def _reference_norm(x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any]:
    """All-reduced x + residual, then RMSNorm, in float64 on the CPU."""
    hidden = x.double() + residual.double()
    variance = hidden.pow(2).mean(dim=-1, keepdim=True)
    return hidden * (variance + eps).rsqrt() * weight.double(), hidden


def _fallback_case() -> Observation:
    """A fused norm whose fused call yields None (no workspace) must all-reduce (a recorder
    adding a fixed "peer" sum), then add and norm."""
    torch = _module("torch")
    dist = _module("sglang.srt.distributed")
    fusion = _module("sglang.srt.layers.flashinfer_comm_fusion")
    RMSNorm = _module("sglang.srt.layers.layernorm").RMSNorm  # noqa: N806

    hidden, tokens, eps = 64, 3, 1e-6
    gen = torch.Generator().manual_seed(120)
    x = torch.randn(tokens, hidden, generator=gen)
    peer = torch.randn(tokens, hidden, generator=gen)
    residual = torch.randn(tokens, hidden, generator=gen)
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
        want_out, want_residual = _reference_norm(x + peer, residual, norm.weight, eps)
        out_ok = bool(torch.allclose(out.double(), want_out, rtol=1e-5, atol=1e-5))
        residual_ok = bool(
            torch.allclose(residual_out.double(), want_residual, rtol=1e-5, atol=1e-5)
        )
        max_err = float((out.double() - want_out).abs().max())
    return {
        "observed": {"attention_tp_all_reduce_calls": len(calls),
                     "tp_all_reduce_calls": len(tp_calls),
                     "matches_reference": out_ok and residual_ok},
        "detail": f"all-reduce over the attention TP group called with {calls}, over the "
                  f"TP group with {tp_calls}; max |norm - reference| = {max_err:.3g}",
    }


def run_fallbacks() -> list[Observation]:
    return [{"name": "fused call returns None", **_fallback_case()}]


SUITES: dict[str, Callable[[], list[Observation]]] = {
    "decisions": run_decisions,
    "fallbacks": run_fallbacks,
}



def main(argv: Sequence[str]) -> int:
    request = json.loads(argv[0])
    start_probe(request.get("capability"), cuda_version=str(request.get("cuda", "12.9")))
    return emit(SUITES[request["suite"]]())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
