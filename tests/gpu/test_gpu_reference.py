"""Reference math and tolerances, on CPU: a wrong or unwritten result must fail."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sm120fork.gpu.core import reference as ref
from sm120fork.gpu.core.cases import Case

_BASE = Case(world_size=4, api="fusion_legacy", pattern="ar_rmsnorm", tokens=8, hidden=256,
             dtype="bf16", strategy="auto", pdl=False)


def _case(**kw: Any) -> Case:
    return dataclasses.replace(_BASE, **kw)


def test_inputs_regenerate_identically_from_the_seed() -> None:
    a = ref.generate(_case(), "cpu")
    b = ref.generate(_case(), "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs, strict=True))
    assert len(a.inputs) == 4
    assert not torch.equal(a.inputs[0], a.inputs[1])
    c = ref.generate(_case(tokens=9), "cpu")
    assert not torch.equal(a.residual[:1], c.residual[:1])


def test_expected_is_sum_residual_rmsnorm() -> None:
    data = ref.generate(_case(world_size=2, tokens=3, hidden=64), "cpu")
    out = ref.expected(data)
    total = data.inputs[0].double() + data.inputs[1].double()
    res = total + data.residual.double()
    norm = res / torch.sqrt((res**2).mean(-1, keepdim=True) + ref.RMS_EPS) * data.gamma.double()
    assert torch.allclose(out["allreduce"].double(), total, atol=1e-5)
    assert torch.allclose(out["residual"].double(), res, atol=1e-5)
    assert torch.allclose(out["norm"].double(), norm, atol=1e-4)


def _kernel_like(case: Case) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What a correct bf16 kernel returns: partial sums rounded after every add."""
    data = ref.generate(case, "cpu")
    want = ref.expected(data)
    acc = data.inputs[0]
    for x in data.inputs[1:]:
        acc = (acc.float() + x.float()).to(torch.bfloat16)
    res = (acc.float() + data.residual.float()).to(torch.bfloat16)
    r = res.float()
    norm = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + ref.RMS_EPS)
            * data.gamma.float()).to(torch.bfloat16)
    return {"allreduce": acc, "residual": res, "norm": norm}, want


def test_a_correct_low_precision_result_passes_at_every_world_size() -> None:
    for ws in (2, 4, 8):
        case = _case(world_size=ws, tokens=64, hidden=2048)
        got, want = _kernel_like(case)
        for name in ("allreduce", "residual", "norm"):
            verdict = ref.compare(name, got[name], want[name], "bf16", ws, stage="eager")
            assert verdict["ok"], verdict


def test_a_missing_rank_fails() -> None:
    case = _case(world_size=8, tokens=16, hidden=1024)
    data = ref.generate(case, "cpu")
    want = ref.expected(data)
    partial = torch.stack([x.float() for x in data.inputs[:-1]]).sum(0).to(torch.bfloat16)
    verdict = ref.compare("allreduce", partial, want["allreduce"], "bf16", 8, stage="eager")
    assert not verdict["ok"]
    assert "rel L2" in verdict["reason"]


def test_one_wrong_element_fails_elementwise() -> None:
    case = _case(tokens=16, hidden=1024)
    got, want = _kernel_like(case)
    bad = got["norm"].clone()
    bad[3, 5] += 4.0
    verdict = ref.compare("norm", bad, want["norm"], "bf16", 4, stage="eager")
    assert not verdict["ok"]
    assert "1 elements out of bounds" in verdict["reason"]


def test_unwritten_nan_output_fails() -> None:
    case = _case()
    got, want = _kernel_like(case)
    bad = got["residual"].clone()
    bad[-1, -1] = float("nan")
    verdict = ref.compare("residual", bad, want["residual"], "bf16", 4, stage="eager")
    assert not verdict["ok"]
    assert verdict["nonfinite"] == 1


def test_fp8_round_trip_within_tolerance() -> None:
    case = _case(tokens=32, hidden=512)
    want = ref.expected(ref.generate(case, "cpu"))["norm"]
    scale = ref.fp8_scale(want)
    quant = (want / scale).to(torch.float8_e4m3fn)
    verdict = ref.compare("quant", ref.dequant_fp8(quant, scale), want, "fp8", 4, stage="eager")
    assert verdict["ok"], verdict
    assert not ref.compare("quant", ref.dequant_fp8(quant, scale * 1.5), want, "fp8", 4,
                           stage="eager")["ok"]


def test_fp4_linear_decoding() -> None:
    # one row of 16 values: e2m1 codes 0..7 and their negatives, block scale 2.0
    codes = list(range(16))
    packed = torch.tensor([codes[i] | (codes[i + 1] << 4) for i in range(0, 16, 2)],
                          dtype=torch.uint8)
    scales = torch.tensor([2.0]).to(torch.float8_e4m3fn).view(torch.uint8)
    out = ref.dequant_fp4_linear(packed, scales, 4.0, (1, 16))
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    want = torch.tensor(e2m1 + [-v for v in e2m1]) * 2.0 / 4.0
    assert torch.equal(out[0], want)


def test_tolerance_table_names_every_kind() -> None:
    kinds = [k for k, _ in ref.tolerance_table()]
    assert kinds == ["bf16", "fp16", "fp8", "fp4"]
