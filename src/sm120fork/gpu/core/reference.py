"""Inputs, fp32 reference results and tolerances for the correctness matrix.

Every rank regenerates every rank's input from the case's seed and computes the reference
itself.  A result passes with no NaN/Inf (outputs are NaN-filled first), relative L2 under
``rel_l2`` and every element within ``atol * world_size + rtol * |ref|``.
"""

from __future__ import annotations

import dataclasses

import torch

from sm120fork.gpu.core.cases import Case
from sm120fork.gpu.core.documents import CheckVerdict

RMS_EPS = 1e-6
FP8_E4M3_MAX = 448.0
FP4_E2M1_MAX = 6.0
FP4_BLOCK = 16

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tolerance:
    """Acceptance bounds for one output kind; ``atol`` is per contributing rank."""

    rel_l2: float
    atol: float
    rtol: float
    elementwise: bool = True

    def describe(self) -> str:
        text = f"rel L2 <= {self.rel_l2:g}"
        if self.elementwise:
            text += (f"; |out-ref| <= {self.atol:g}*world_size + {self.rtol:g}*|ref| "
                     "per element")
        return text + "; no NaN/Inf"


#: Keys: the output's storage kind ("bf16", "fp16", "fp8", "fp4").
TOLERANCES: dict[str, Tolerance] = {
    # bf16 keeps 8 mantissa bits: one rounding is 2^-9 relative; the kernels round after
    # each of the world_size - 1 partial sums.
    "bf16": Tolerance(rel_l2=1.5e-2, atol=1.6e-2, rtol=2e-2),
    "fp16": Tolerance(rel_l2=3e-3, atol=2e-3, rtol=4e-3),
    # e4m3 keeps 3 mantissa bits: rounding error up to 2^-4 relative, plus subnormals.
    "fp8": Tolerance(rel_l2=6e-2, atol=1.5e-2, rtol=8e-2),
    # e2m1 with a 16-element block scale: elementwise error up to a quarter of the block
    # maximum, so only the L2 bound is meaningful.
    "fp4": Tolerance(rel_l2=0.2, atol=0.0, rtol=0.0, elementwise=False),
}


@dataclasses.dataclass(frozen=True)
class CaseData:
    """All ranks' inputs of one case, in the case's dtype, on one device."""

    inputs: list[torch.Tensor]
    residual: torch.Tensor
    gamma: torch.Tensor


def generate(case: Case, device: torch.device | str) -> CaseData:
    """Regenerate every rank's inputs from ``case.seed`` (identical on every rank)."""
    dtype = TORCH_DTYPES[case.dtype]
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    shape = (case.tokens, case.hidden)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32)

    inputs = [randn(*shape).to(dtype) for _ in range(case.world_size)]
    residual = randn(*shape).to(dtype)
    gamma = (1.0 + 0.1 * randn(case.hidden)).to(dtype)
    return CaseData(inputs=inputs, residual=residual, gamma=gamma)


def expected(data: CaseData) -> dict[str, torch.Tensor]:
    """fp32 all-reduce, residual add and RMSNorm of ``data``."""
    allreduce = torch.stack([x.float() for x in data.inputs]).sum(dim=0)
    residual = allreduce + data.residual.float()
    rms = torch.rsqrt(residual.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)
    norm = residual * rms * data.gamma.float()
    return {"allreduce": allreduce, "residual": residual, "norm": norm}


def fp8_scale(norm_ref: torch.Tensor) -> float:
    """Per-tensor scale so that the reference norm fills e4m3's range; kernel divides by it."""
    amax = float(norm_ref.abs().max())
    return max(amax, 1e-6) / FP8_E4M3_MAX


def fp4_global_scale(norm_ref: torch.Tensor) -> float:
    """NVFP4's global scale: the kernel multiplies by it before the block scales."""
    amax = float(norm_ref.abs().max())
    return FP8_E4M3_MAX * FP4_E2M1_MAX / max(amax, 1e-6)


def dequant_fp8(quant: torch.Tensor, scale: float) -> torch.Tensor:
    """FlashInfer's fp8 output is ``fp8(norm / scale)``."""
    return quant.float() * scale


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def dequant_fp4_linear(packed: torch.Tensor, scales: torch.Tensor, global_scale: float,
                       shape: tuple[int, int]) -> torch.Tensor:
    """Decode NVFP4 (two e2m1 per byte, low nibble first; one e4m3 scale per 16 values,
    row-major/"LINEAR" layout): ``value = e2m1 * block_scale / global_scale``."""
    rows, cols = shape
    lut = torch.tensor(_E2M1 + tuple(-v for v in _E2M1), dtype=torch.float32,
                       device=packed.device)
    raw = packed.reshape(-1).to(torch.int64)
    nibbles = torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(rows, cols)
    values = lut[nibbles]
    block = scales.reshape(-1)[: rows * cols // FP4_BLOCK]
    block_f = block.view(torch.float8_e4m3fn).float().reshape(rows, cols // FP4_BLOCK)
    return values * block_f.repeat_interleave(FP4_BLOCK, dim=1) / global_scale


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, kind: str, world_size: int, *,
            stage: str) -> CheckVerdict:
    """Check one output against its reference at ``stage``; returns a JSON-ready verdict."""
    tol = TOLERANCES[kind]
    got32 = got.float().reshape(ref.shape)
    ref32 = ref.float()
    bad_values = int((~torch.isfinite(got32)).sum())
    result: CheckVerdict = {"output": name, "stage": stage, "kind": kind,
                            "nonfinite": bad_values}
    if bad_values:
        return {**result, "rel_l2": None, "max_abs": None, "ok": False,
                "reason": f"{bad_values} of {got32.numel()} elements NaN/Inf (unwritten or "
                "overflow)"}
    diff = (got32 - ref32).abs()
    rel_l2 = float(torch.linalg.vector_norm(got32 - ref32)) / (
        float(torch.linalg.vector_norm(ref32)) or 1.0)
    reasons = [f"rel L2 {rel_l2:.3g} > {tol.rel_l2:g}"] if rel_l2 > tol.rel_l2 else []
    if tol.elementwise:
        bound = tol.atol * world_size + tol.rtol * ref32.abs()
        n_over = int((diff > bound).sum())
        if n_over:
            idx = int(torch.argmax((diff - bound).reshape(-1)))
            reasons.append(
                f"{n_over} elements out of bounds (worst flat index {idx}: got "
                f"{float(got32.reshape(-1)[idx]):.4g}, want {float(ref32.reshape(-1)[idx]):.4g})")
    return {**result, "rel_l2": rel_l2, "max_abs": float(diff.max()) if diff.numel() else 0.0,
            "ok": not reasons, "reason": "; ".join(reasons)}


def tolerance_table() -> list[tuple[str, str]]:
    """(kind, description) rows for the report."""
    return [(kind, tol.describe()) for kind, tol in TOLERANCES.items()]
