"""The compile proof as markdown: variants side by side per architecture, then detail."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path

from sm120fork.cuda.cubin import (
    EMPTY_BODY_BYTES,
    EMPTY_BODY_FRACTION,
    LARGE_BODY_BYTES,
    PdlOpcodes,
    is_empty_body,
)
from sm120fork.util.markdown import markdown_table
from sm120fork.verify.proof.verdict import (
    ArchResult,
    ProofReport,
    VariantResult,
    Verdict,
    lost_pdl,
)

#: The host-side call the F5 check looks for (the device's cluster-size answer).
CLUSTER_QUERY = "cudaOccupancyMaxPotentialClusterSize"


def _pdl_cell(v: Verdict, opcodes: Mapping[str, PdlOpcodes]) -> str:
    if v.pdl is None or v.pdl_reference is None:
        return "not checked"
    ops = opcodes.get(v.arch)
    names = f" ({'/'.join(ops.wait)} / {'/'.join(ops.launch)})" if ops else ""
    text = f"{v.pdl[0]} / {v.pdl[1]} vs {v.pdl_reference[0]} / {v.pdl_reference[1]}{names}"
    if v.pdl_lost:
        text += f"; {len(v.pdl_lost)} kernels lost PDL"
    return text


def _kernels_cell(r: ArchResult | None, v: Verdict) -> str:
    if r is None or not r.compiled:
        return "not compiled"
    return f"{v.present} / {v.reference_kernels}" + (" (forced)" if r.forced else "")


def _seconds_cell(r: ArchResult | None) -> str:
    if r is None or not r.compiled:
        return "-"
    cached = bool(r.units) and all(u.cached for u in r.units)
    return f"{sum(u.seconds for u in r.units):.1f}" + (" (cached)" if cached else "")


def host_calls_cell(r: ArchResult | None) -> str:
    calling = r.units_calling(CLUSTER_QUERY) if r is not None else None
    if calling is None:
        return "-"
    return f"{sum(calling.values())} / {len(calling)} units"


def render_markdown(report: ProofReport) -> str:
    opcodes = {p.arch: p for p in report.pdl_opcodes}
    verdicts = {(v.variant, v.arch): v for v in report.verdicts()}
    names = [v.name for v in report.variants]
    lines = ["# SM12x proof: trtllm comm module", "",
             f"Compiler: {report.nvcc_version}. Reference: {report.reference_arch}. "
             f"An SM12x kernel is empty when its body is <= {EMPTY_BODY_BYTES} bytes or < "
             f"{EMPTY_BODY_FRACTION:.0%} of a > {LARGE_BODY_BYTES}-byte {report.reference_arch}"
             " body. PDL: wait / launch instructions summed over kernels, against the "
             f"reference. Host objects ({', '.join(report.host_archs) or 'none'}): how many "
             f"translation units' host code calls `{CLUSTER_QUERY}`. "
             f"Proof wall time: {report.wall_seconds:.0f} s.", "",
             "## Summary", ""]
    rows: list[list[str]] = []
    for arch in report.archs:
        results = [v.arch(arch) for v in report.variants]
        row_verdicts = [verdicts[(name, arch)] for name in names]
        pairs = list(zip(results, row_verdicts, strict=True))
        rows += [
            [arch, "JIT gate", *("-" if r is None else "accepted" if r.gate.accepted
                                 else f"refused: `{r.gate.error}`" for r in results)],
            [arch, f"kernels present / {report.reference_arch}",
             *(_kernels_cell(r, v) for r, v in pairs)],
            [arch, "empty kernels", *(str(len(v.empty)) if r is not None and r.compiled
                                      else "-" for r, v in pairs)],
            [arch, "PDL", *(_pdl_cell(v, opcodes) if r is not None and r.compiled else "-"
                            for r, v in pairs)],
        ]
        if arch in report.host_archs:
            rows.append([arch, f"host code calls {CLUSTER_QUERY}",
                         *(host_calls_cell(r) for r in results)])
        rows += [
            [arch, "compile s", *(_seconds_cell(r) for r in results)],
            [arch, "verdict", *(f"**{v.status.value.upper()}**" for v in row_verdicts)],
        ]
    lines += markdown_table(["arch", "check", *names], rows)
    lines += ["", "## Compile seconds per translation unit", "",
              "Wall time of each nvcc run (cached: taken from the run that made the cubin).",
              ""]
    sources = sorted({u.source for v in report.variants for a in v.archs for u in a.units})
    unit_rows = []
    for variant in report.variants:
        for result in variant.archs:
            if not result.compiled:
                continue
            by_source = {u.source: u for u in result.units}
            unit_rows.append([variant.name, result.arch, *(
                "-" if (u := by_source.get(s)) is None
                else f"{u.seconds:.1f}" + (" (cached)" if u.cached else "") for s in sources)])
    lines += markdown_table(["variant", "arch", *(Path(s).name for s in sources)], unit_rows)
    for variant in report.variants:
        lines += ["", f"## Kernel families: {variant.name}", ""]
        lines += _family_table(variant, report)
    return "\n".join(lines) + "\n"


def _family_table(variant: VariantResult, report: ProofReport) -> list[str]:
    compiled = [a for a in variant.archs if a.compiled]
    if not compiled:
        return ["Nothing was compiled."]
    reference = variant.arch(report.reference_arch)
    ref_kernels = reference.kernels if reference and reference.compiled else {}
    sizes: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    empties: dict[str, Counter[str]] = defaultdict(Counter)
    no_pdl: dict[str, Counter[str]] = defaultdict(Counter)
    for result in compiled:
        for kernel in result.kernels.values():
            sizes[kernel.family][result.arch].append(kernel.size)
            ref = ref_kernels.get(kernel.name)
            if ref is None or result.arch == report.reference_arch:
                continue
            empties[kernel.family][result.arch] += is_empty_body(kernel.size, ref.size)
            no_pdl[kernel.family][result.arch] += lost_pdl(kernel, ref)
    rows = []
    for family in sorted(sizes):
        row = [f"`{family}`"]
        for result in compiled:
            found = sizes[family].get(result.arch, [])
            if not found:
                row.append("-")
                continue
            cell = f"{len(found)} / {min(found)} / {statistics.median(found):.0f}"
            notes = [f"{count} {what}" for count, what in (
                (empties[family][result.arch], "empty"),
                (no_pdl[family][result.arch], "lost PDL")) if count]
            if notes:
                cell += f" ({', '.join(notes)})"
            row.append(cell)
        rows.append(row)
    header = ["family", *(f"{a.arch}: n / min B / median B" for a in compiled)]
    return markdown_table(header, rows)
