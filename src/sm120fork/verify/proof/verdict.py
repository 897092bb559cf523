"""Results of the compile proof and the verdict per tree variant and architecture."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sm120fork.cuda.arch import REFERENCE_ARCH
from sm120fork.cuda.cubin import Kernel, PdlOpcodes, missing_and_empty


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateResult:
    """What ``gen_trtllm_comm_module()`` said for one FLASHINFER_CUDA_ARCH_LIST value."""

    arch: str
    arch_list: str
    accepted: bool
    error: str | None = None
    sources: tuple[str, ...] = ()
    nvcc_flags: tuple[str, ...] = ()
    compile_flags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitResult:
    source: str
    cubin: Path
    key: str
    seconds: float
    cached: bool
    kernels: tuple[Kernel, ...]
    #: The CUDA runtime functions its host object calls (None: no host object).
    host_calls: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchResult:
    arch: str
    gate: GateResult
    compiled: bool
    forced: bool = False
    #: Whether the proof meant to compile it (a variant need not be built everywhere).
    planned: bool = True
    units: tuple[UnitResult, ...] = ()
    pdl_opcodes: PdlOpcodes | None = None

    @property
    def kernels(self) -> dict[str, Kernel]:
        return {k.name: k for unit in self.units for k in unit.kernels}

    def units_calling(self, function: str) -> dict[str, bool] | None:
        """Per translation unit, whether its host object calls ``function`` (None: no
        host objects were built for this architecture)."""
        if not self.units or any(u.host_calls is None for u in self.units):
            return None
        return {u.source: function in (u.host_calls or ()) for u in self.units}


@dataclasses.dataclass(frozen=True, kw_only=True)
class VariantResult:
    name: str
    tree: Path
    archs: tuple[ArchResult, ...]

    def arch(self, arch: str) -> ArchResult | None:
        return next((a for a in self.archs if a.arch == arch), None)


#: The host-side call the F5 check looks for (the device's cluster-size answer).
CLUSTER_QUERY = "cudaOccupancyMaxPotentialClusterSize"


class Status(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_CHECKED = "not checked"


def lost_pdl(kernel: Kernel, reference: Kernel) -> bool:
    """The reference kernel waits on / triggers dependent launches and ``kernel`` does
    not (unknown counts are never a loss)."""
    if None in (kernel.pdl_wait, kernel.pdl_launch, reference.pdl_wait, reference.pdl_launch):
        return False
    return bool(((reference.pdl_wait or 0) > 0 and kernel.pdl_wait == 0)
                or ((reference.pdl_launch or 0) > 0 and kernel.pdl_launch == 0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a variant's ``arch`` build carries every sm_90a kernel with a real body."""

    variant: str
    arch: str
    status: Status
    reasons: tuple[str, ...]
    reference_kernels: int = 0
    present: int = 0
    missing: tuple[str, ...] = ()
    empty: tuple[str, ...] = ()
    pdl_reference: tuple[int, int] | None = None
    pdl: tuple[int, int] | None = None
    pdl_lost: tuple[str, ...] = ()


def _pdl_totals(kernels: Iterable[Kernel]) -> tuple[int, int] | None:
    counts = [(k.pdl_wait, k.pdl_launch) for k in kernels]
    if any(None in pair for pair in counts):
        return None
    return sum(w for w, _ in counts if w), sum(la for _, la in counts if la)


def verdict(variant: VariantResult, arch: str) -> Verdict:
    """Pass when the gate accepts and every reference kernel exists with a real body and
    its PDL instructions; a build not planned whose gate accepts is "not checked"."""
    reasons: list[str] = []
    result = variant.arch(arch)
    reference = variant.arch(REFERENCE_ARCH)

    def done(status: Status, **fields: Any) -> Verdict:
        return Verdict(variant=variant.name, arch=arch, status=status, reasons=tuple(reasons),
                       **fields)

    if result is None:
        reasons.append(f"{arch} was not part of the proof")
        return done(Status.FAIL)
    if not result.gate.accepted:
        reasons.append(f"JIT gate refused {result.gate.arch_list}: {result.gate.error}")
    if not result.compiled and not result.planned and result.gate.accepted:
        reasons.append(f"gate accepts; not compiled for {arch} in this proof")
        return done(Status.NOT_CHECKED)
    ref_kernels = reference.kernels if reference is not None and reference.compiled else {}
    if not ref_kernels:
        reasons.append(f"no compiled {REFERENCE_ARCH} reference")
        return done(Status.FAIL)
    if not result.compiled:
        reasons.append(f"not compiled for {arch}")
        return done(Status.FAIL, reference_kernels=len(ref_kernels))
    kernels = result.kernels
    missing, empty = missing_and_empty({n: k.size for n, k in ref_kernels.items()},
                                       {n: k.size for n, k in kernels.items()})
    pdl_reference = _pdl_totals(ref_kernels.values())
    pdl = _pdl_totals(kernels.values())
    checked = pdl_reference is not None and pdl is not None
    lost = sorted(name for name, ref in ref_kernels.items()
                  if checked and name in kernels and lost_pdl(kernels[name], ref))
    for count, what in ((len(missing), f"of {len(ref_kernels)} {REFERENCE_ARCH} kernels missing"),
                        (len(empty), "kernels have an empty body"),
                        (len(lost), "kernels lost their PDL instructions")):
        if count:
            reasons.append(f"{count} {what}")
    status = Status.FAIL if reasons else Status.PASS
    if status is Status.PASS and arch != REFERENCE_ARCH and not checked:
        reasons.append("PDL instructions not checked (no cuobjdump/nvdisasm)")
        status = Status.NOT_CHECKED
    return done(status, reference_kernels=len(ref_kernels),
                present=len(ref_kernels) - len(missing), missing=missing, empty=empty,
                pdl_reference=pdl_reference, pdl=pdl, pdl_lost=tuple(lost))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProofReport:
    variants: tuple[VariantResult, ...]
    archs: tuple[str, ...]
    reference_arch: str
    nvcc_version: str
    pdl_opcodes: tuple[PdlOpcodes, ...]
    wall_seconds: float
    #: Architectures whose host objects were built (the CUDA runtime calls are read there).
    host_archs: tuple[str, ...] = ()

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def verdicts(self) -> list[Verdict]:
        return [verdict(v, a) for v in self.variants for a in self.archs]

    def document(self) -> Any:
        """The report and its verdicts as JSON data (a path as its text)."""
        data = {"report": dataclasses.asdict(self),
                "verdicts": [dataclasses.asdict(v) for v in self.verdicts()]}
        return json.loads(json.dumps(data, default=str))
