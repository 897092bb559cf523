"""One correctness case inside a rank: inputs, the call (eager and graph replays), checks."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from sm120fork.gpu.core.cases import (
    CUSTOM_API,
    PATTERN_CODES,
    Case,
    environment_reason,
    skip_reason,
)
from sm120fork.gpu.core.rank import (
    EXIT_CUDA_ERROR,
    Rank,
    cuda_broken,
    hard_exit,
    legacy_custom_all_reduce,
    say,
    stage,
)
from sm120fork.gpu.core.reference import (
    FP4_BLOCK,
    RMS_EPS,
    TORCH_DTYPES,
    compare,
    dequant_fp4_linear,
    dequant_fp8,
    expected,
    fp4_global_scale,
    fp8_scale,
    generate,
)


def _nan_fill(t: torch.Tensor) -> None:
    if t.dtype in (torch.bfloat16, torch.float16, torch.float32):
        t.fill_(float("nan"))
    elif t.dtype == torch.float8_e4m3fn:
        t.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
    else:
        t.fill_(0xFF)


def run_case(rk: Rank, case: Case) -> dict[str, Any]:
    fc = rk.fc
    dtype = TORCH_DTYPES[case.dtype]
    data = generate(case, rk.device)
    ref = expected(data)
    x = data.inputs[rk.rank].contiguous()
    t, h = case.tokens, case.hidden
    outs: dict[str, torch.Tensor] = {}
    checks: list[tuple[str, str, torch.Tensor]] = []  # (output, kind, reference)
    pattern = case.pattern
    quant = pattern.endswith(("fp8", "fp4"))
    scale_tensor: torch.Tensor | None = None
    fp4_scale = 0.0

    def new(name: str, shape: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
        outs[name] = torch.empty(shape, dtype=dt, device=rk.device)
        return outs[name]

    new("allreduce_out", (t, h), dtype)
    if pattern == "allreduce":
        checks.append(("allreduce_out", case.dtype, ref["allreduce"]))
    else:
        new("residual_out", (t, h), dtype)
        checks.append(("residual_out", case.dtype, ref["residual"]))
        if not quant or "_out_" in pattern:
            new("norm_out", (t, h), dtype)
            checks.append(("norm_out", case.dtype, ref["norm"]))
    if pattern.endswith("fp8"):
        new("quant_out", (t, h), torch.float8_e4m3fn)
        scale_tensor = torch.tensor([fp8_scale(ref["norm"])], dtype=torch.float32,
                                    device=rk.device)
        checks.append(("quant_out", "fp8", ref["norm"]))
    elif pattern.endswith("fp4"):
        new("quant_out", (t, h // 2), torch.uint8)
        sf_elems = fc.compute_fp4_swizzled_layout_sf_size(t, h // FP4_BLOCK)
        new("scale_out", (sf_elems,), torch.uint8)
        fp4_scale = fp4_global_scale(ref["norm"])
        scale_tensor = torch.tensor([fp4_scale], dtype=torch.float32, device=rk.device)
        checks.append(("quant_out", "fp4", ref["norm"]))

    use_oneshot = {"oneshot": True, "twoshot": False, "auto": None}[case.strategy]
    layout = fc.QuantizationSFLayout.LINEAR if pattern.endswith("fp4") else None
    residual_in = None if pattern == "allreduce" else data.residual
    gamma = None if pattern == "allreduce" else data.gamma

    def flat(name: str) -> torch.Tensor | None:
        return outs[name].view(-1) if name in outs else None

    if case.api == "fusion_legacy":
        ws = rk.workspace(case.api)

        def call_once() -> None:
            fc.trtllm_allreduce_fusion(
                allreduce_in=x.view(-1), world_size=case.world_size, world_rank=rk.rank,
                token_num=t, hidden_dim=h, workspace_ptrs=ws["tensor"],
                launch_with_pdl=case.pdl, trigger_completion_at_end=case.pdl,
                fp32_acc=False, pattern_code=PATTERN_CODES[pattern], use_oneshot=use_oneshot,
                allreduce_out=flat("allreduce_out"),
                residual_in=None if residual_in is None else residual_in.view(-1),
                residual_out=flat("residual_out"), norm_out=flat("norm_out"),
                quant_out=flat("quant_out"), scale_out=outs.get("scale_out"),
                rms_gamma=gamma, rms_eps=RMS_EPS, scale_factor=scale_tensor,
                layout_code=layout, metadata=ws["metadata"])

        calls: Callable[[], None] = call_once
        graph_calls = 1
    elif case.api == "fusion_unified":
        uws = rk.workspace(case.api)

        def call_unified() -> None:
            fc.allreduce_fusion(
                input=x, workspace=uws, pattern=PATTERN_CODES[pattern],
                launch_with_pdl=case.pdl, output=outs["allreduce_out"],
                residual_out=outs.get("residual_out"), norm_out=outs.get("norm_out"),
                quant_out=outs.get("quant_out"), scale_out=outs.get("scale_out"),
                residual_in=residual_in, rms_gamma=gamma, rms_eps=RMS_EPS,
                scale_factor=scale_tensor, layout_code=layout, use_oneshot=use_oneshot,
                fp32_acc=False)

        calls = call_unified
        graph_calls = 1
    else:
        cws = rk.workspace(case.api)
        rk.reset_lamport(cws)
        p = cws["ptrs"]
        inter = outs["residual_out"]
        norm = outs["norm_out"]

        custom_all_reduce = legacy_custom_all_reduce(fc)

        def call_custom(flag: int) -> None:
            custom_all_reduce(
                x, norm, case.world_size, rk.rank, t,
                fc.AllReduceFusionOp.RESIDUAL_RMS_NORM, fc.AllReduceStrategyType.ONESHOT,
                0, case.pdl, flag, p[0], p[2], p[3], None, data.residual, data.gamma, None,
                RMS_EPS, inter, p[4], p[5], p[6])

        # The flag is a host argument baked into a graph: capture three consecutive
        # flags so that replays cycle the lamport triple buffer like eager calls do.
        def call_next_flag() -> None:
            call_custom(rk.next_flag())

        calls = call_next_flag
        graph_calls = 3

    def verify(stage: str) -> list[dict[str, Any]]:
        verdicts = []
        for name, kind, reference in checks:
            got = outs[name]
            if kind == "fp8":
                got = dequant_fp8(got, float(scale_tensor))  # type: ignore[arg-type]
            elif kind == "fp4":
                got = dequant_fp4_linear(got, outs["scale_out"], fp4_scale, (t, h))
            v = compare(name, got, reference, kind, case.world_size)
            v["stage"] = stage
            verdicts.append(v)
        return verdicts

    def fill() -> None:
        for tensor in outs.values():
            _nan_fill(tensor)
        torch.cuda.synchronize()
        rk.barrier()

    stage("eager call")
    fill()
    calls()
    torch.cuda.synchronize()
    verdicts = verify("eager")
    if case.api == CUSTOM_API and not case.lamport:
        # The non-lamport path synchronizes ranks with flag barriers that compare for
        # equality against a host-side flag.  Baked into a graph, the flags repeat on the
        # second replay, a stale flag satisfies a barrier, and a rank that runs ahead
        # overwrites a slot a slower rank still waits on: a hang whenever ranks are not
        # in lock step (seen with ranks sharing a GPU; FlashInfer's own fusion API keeps
        # its flags on the device).  So this path is checked with eager calls only, each
        # with the next flag.
        for call in range(2):
            stage(f"eager call {call + 2}")
            fill()
            calls()
            torch.cuda.synchronize()
            verdicts += verify(f"eager call {call + 2}")
        ok = all(v["ok"] for v in verdicts)
        return {"status": "pass" if ok else "fail",
                "failure": None if ok else "wrong result", "checks": verdicts,
                "note": "eager only: host-side barrier flags cannot be graph-replayed"}
    stage("graph capture")

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(graph_calls):
            calls()
    torch.cuda.synchronize()
    for replay in range(2):
        stage(f"graph replay {replay + 1}")
        fill()
        graph.replay()
        torch.cuda.synchronize()
        verdicts += verify(f"graph replay {replay + 1}")
    del graph
    ok = all(v["ok"] for v in verdicts)
    return {"status": "pass" if ok else "fail",
            "failure": None if ok else "wrong result",
            "checks": verdicts}


def legacy_workspace_is_torch_symm() -> bool:
    """Whether the imported FlashInfer makes the legacy fusion workspace as torch symmetric
    memory (its ``comm.trtllm_ar`` uses ``_alloc_symm_buffer_bytes``, FlashInfer 0.7.x)."""
    module = sys.modules.get("flashinfer.comm.trtllm_ar")
    return module is not None and hasattr(module, "_alloc_symm_buffer_bytes")


def run_tests(rk: Rank, cases: list[Case]) -> None:
    for case in cases:
        say("START", case.key)
        record: dict[str, Any] = {"key": case.key, "rank": rk.rank}
        reason = skip_reason(case, rk.capability) or environment_reason(
            case.api, shared=rk.shared,
            legacy_workspace_torch_symm=legacy_workspace_is_torch_symm())
        if reason:
            record.update(status="skip", reason=reason)
            say("RESULT", record)
            continue
        try:
            record.update(run_case(rk, case))
        except Exception as exc:
            record.update(status="fail", failure="error",
                          reason=f"{type(exc).__name__}: {exc}"[:2000],
                          traceback=traceback.format_exc()[-3000:])
            say("RESULT", record)
            if cuda_broken(exc):
                hard_exit(EXIT_CUDA_ERROR)
            rk.barrier()
            continue
        say("RESULT", record)
        rk.barrier()

