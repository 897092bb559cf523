"""One A/B rank, ``python -m sm120fork.gpu.ab.correctness SPEC RANK``: each case's inputs,
its call (eager and graph replays) and checks."""

from __future__ import annotations

import dataclasses
import functools
import sys
import traceback
from collections.abc import Callable

import torch

from sm120fork.gpu.ab.results import CaseResult, Check
from sm120fork.gpu.core import worker
from sm120fork.gpu.core.cases import (
    CUSTOM_API,
    PATTERN_CODES,
    TORCH_SYMM_SHARED_GPU,
    Case,
    RankSpec,
    skip_reason,
)
from sm120fork.gpu.core.reference import (
    FP4_BLOCK,
    RMS_EPS,
    TORCH_DTYPES,
    CaseData,
    compare,
    dequant_fp4_linear,
    dequant_fp8,
    expected,
    fp4_global_scale,
    fp8_scale,
    generate,
)
from sm120fork.gpu.core.worker import (
    EXIT_CUDA_ERROR,
    Rank,
    capture_graph,
    cuda_broken,
    hard_exit,
    legacy_custom_all_reduce,
    say,
    stage,
)
from sm120fork.util import typed


def _nan_fill(t: torch.Tensor) -> None:
    if t.dtype in (torch.bfloat16, torch.float16, torch.float32):
        t.fill_(float("nan"))
    elif t.dtype == torch.float8_e4m3fn:
        t.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
    else:
        t.fill_(0xFF)


@dataclasses.dataclass
class _Outputs:
    """A case's output buffers, what each is checked against, and the quantization scale."""

    device: torch.device
    outs: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    #: (output, kind, reference, the output read back as the reference's values)
    checks: list[tuple[str, str, torch.Tensor, Callable[[], torch.Tensor]]] = dataclasses.field(
        default_factory=list)
    scale: torch.Tensor | None = None

    def new(self, name: str, shape: tuple[int, ...], dt: torch.dtype, kind: str | None = None,
            reference: torch.Tensor | None = None,
            read: Callable[[], torch.Tensor] | None = None) -> None:
        out = self.outs[name] = torch.empty(shape, dtype=dt, device=self.device)
        if kind is not None and reference is not None:
            self.checks.append((name, kind, reference, read or (lambda: out)))

    def flat(self, name: str) -> torch.Tensor | None:
        return self.outs[name].view(-1) if name in self.outs else None


def _outputs(rk: Rank, case: Case, ref: dict[str, torch.Tensor]) -> _Outputs:
    t, h, pattern = case.tokens, case.hidden, case.pattern
    dtype = TORCH_DTYPES[case.dtype]
    o = _Outputs(rk.device)
    if pattern == "allreduce":
        o.new("allreduce_out", (t, h), dtype, case.dtype, ref["allreduce"])
        return o
    o.new("allreduce_out", (t, h), dtype)
    o.new("residual_out", (t, h), dtype, case.dtype, ref["residual"])
    if not pattern.endswith(("fp8", "fp4")) or "_out_" in pattern:
        o.new("norm_out", (t, h), dtype, case.dtype, ref["norm"])
    if pattern.endswith("fp8"):
        o.scale = torch.tensor([fp8_scale(ref["norm"])], dtype=torch.float32, device=rk.device)
        o.new("quant_out", (t, h), torch.float8_e4m3fn, "fp8", ref["norm"],
              lambda: dequant_fp8(o.outs["quant_out"], float(o.scale)))  # type: ignore[arg-type]
    elif pattern.endswith("fp4"):
        fp4_scale = fp4_global_scale(ref["norm"])
        o.scale = torch.tensor([fp4_scale], dtype=torch.float32, device=rk.device)
        o.new("quant_out", (t, h // 2), torch.uint8, "fp4", ref["norm"],
              lambda: dequant_fp4_linear(o.outs["quant_out"], o.outs["scale_out"], fp4_scale,
                                         (t, h)))
        o.new("scale_out", (rk.fc.compute_fp4_swizzled_layout_sf_size(t, h // FP4_BLOCK),),
              torch.uint8)
    return o


def _call(rk: Rank, case: Case, data: CaseData, o: _Outputs) -> tuple[Callable[[], None], int]:
    """The case's one call, and how many calls a graph captures."""
    fc, x, pattern = rk.fc, data.inputs[rk.rank].contiguous(), case.pattern
    use_oneshot = {"oneshot": True, "twoshot": False, "auto": None}[case.strategy]
    layout = fc.QuantizationSFLayout.LINEAR if pattern.endswith("fp4") else None
    residual_in = None if pattern == "allreduce" else data.residual
    gamma = None if pattern == "allreduce" else data.gamma
    outs = o.outs
    common = {"launch_with_pdl": case.pdl, "use_oneshot": use_oneshot, "fp32_acc": False,
              "rms_gamma": gamma, "rms_eps": RMS_EPS, "scale_factor": o.scale,
              "layout_code": layout, "scale_out": outs.get("scale_out")}
    if case.api == "fusion_legacy":
        ws = rk.workspace(case.api)
        return functools.partial(
            fc.trtllm_allreduce_fusion, allreduce_in=x.view(-1), world_size=case.world_size,
            world_rank=rk.rank, token_num=case.tokens, hidden_dim=case.hidden,
            workspace_ptrs=ws["tensor"], trigger_completion_at_end=case.pdl,
            pattern_code=PATTERN_CODES[pattern], allreduce_out=o.flat("allreduce_out"),
            residual_in=None if residual_in is None else residual_in.view(-1),
            residual_out=o.flat("residual_out"), norm_out=o.flat("norm_out"),
            quant_out=o.flat("quant_out"), metadata=ws["metadata"], **common), 1
    if case.api == "fusion_unified":
        return functools.partial(
            fc.allreduce_fusion, input=x, workspace=rk.workspace(case.api),
            pattern=PATTERN_CODES[pattern], output=outs["allreduce_out"],
            residual_out=outs.get("residual_out"), norm_out=outs.get("norm_out"),
            quant_out=outs.get("quant_out"), residual_in=residual_in, **common), 1
    cws = rk.workspace(case.api)
    rk.reset_lamport(cws)
    p = cws["ptrs"]
    custom_all_reduce = legacy_custom_all_reduce(fc)

    # The flag is a host argument baked into a graph: capture three consecutive flags so
    # that replays cycle the lamport triple buffer like eager calls do.
    def call_next_flag() -> None:
        custom_all_reduce(
            x, outs["norm_out"], case.world_size, rk.rank, case.tokens,
            fc.AllReduceFusionOp.RESIDUAL_RMS_NORM, fc.AllReduceStrategyType.ONESHOT,
            0, case.pdl, rk.next_flag(), p[0], p[2], p[3], None, data.residual, data.gamma,
            None, RMS_EPS, outs["residual_out"], p[4], p[5], p[6])

    return call_next_flag, 3


def run_case(rk: Rank, case: Case) -> CaseResult:
    """One case on this rank: eager, then captured in a CUDA graph and replayed twice."""
    data = generate(case, rk.device)
    o = _outputs(rk, case, expected(data))
    call, graph_calls = _call(rk, case, data, o)

    def verify(stage: str) -> list[Check]:
        return [Check(**compare(name, read(), reference, kind, case.world_size, stage=stage))
                for name, kind, reference, read in o.checks]

    def once(name: str, run: Callable[[], None]) -> list[Check]:
        stage(name)
        for tensor in o.outs.values():
            _nan_fill(tensor)
        torch.cuda.synchronize()
        rk.barrier()
        run()
        torch.cuda.synchronize()
        return verify(name)

    verdicts = once("eager", call)
    note = None
    if case.api == CUSTOM_API and not case.lamport:
        # Its barriers compare against a host-side flag: replayed from a graph, a stale
        # flag lets a rank run ahead and hang its peers, so eager calls only.
        verdicts += once("eager call 2", call) + once("eager call 3", call)
        note = "eager only: host-side barrier flags cannot be graph-replayed"
    else:
        stage("graph capture")
        graph = capture_graph([call], graph_calls)
        verdicts += once("graph replay 1", graph.replay) + once("graph replay 2", graph.replay)
        del graph
    ok = all(v.ok for v in verdicts)
    return CaseResult(key=case.key, rank=rk.rank, status="pass" if ok else "fail",
                      failure=None if ok else "wrong result", checks=tuple(verdicts),
                      note=note)


def run_tests(rk: Rank, cases: list[Case]) -> None:
    # FlashInfer 0.7.x makes the legacy fusion workspace as torch symmetric memory
    symm = hasattr(sys.modules.get("flashinfer.comm.trtllm_ar"), "_alloc_symm_buffer_bytes")
    for case in cases:
        say("START", case.key)
        reason = skip_reason(case, rk.capability) or (
            TORCH_SYMM_SHARED_GPU if case.api == "fusion_legacy" and rk.shared and symm
            else None)
        broken = False
        if reason:
            result = CaseResult(key=case.key, rank=rk.rank, status="skip", reason=reason)
        else:
            try:
                result = run_case(rk, case)
            except Exception as exc:
                result = CaseResult(key=case.key, rank=rk.rank, status="fail", failure="error",
                                    reason=f"{type(exc).__name__}: {exc}"[:2000],
                                    traceback=traceback.format_exc()[-3000:])
                broken = cuda_broken(exc)
        say("RESULT", dataclasses.asdict(result))
        if broken:
            hard_exit(EXIT_CUDA_ERROR)
        if not reason:
            rk.barrier()


if __name__ == "__main__":
    worker.serve({"test": lambda rank, spec: run_tests(
        rank, list(typed.read(RankSpec, spec, "the group's spec").cases))})
