"""The verify-sm120 record (``reports/<stack>/verify-sm120/``) and the full report in
``.forks/reports/sm120/<stack>/``; the compile proof as markdown (variants side by side per
architecture, then detail)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sm120fork import __version__
from sm120fork.cuda.cubin import (
    EMPTY_BODY_BYTES,
    EMPTY_BODY_FRACTION,
    LARGE_BODY_BYTES,
    Kernel,
    PdlOpcodes,
    family_rows,
    is_empty_body,
)
from sm120fork.record import (
    KINDS,
    Case,
    Machine,
    Record,
    Tested,
    TestedTree,
    TestedWheel,
    make,
)
from sm120fork.record import write as write_record
from sm120fork.util import portable as util_portable
from sm120fork.util.files import atomic_write_text
from sm120fork.util.portable import markdown_table
from sm120fork.verify.proof.patches import FULL
from sm120fork.verify.proof.run import (
    CLUSTER_QUERY,
    ArchResult,
    ProofReport,
    VariantResult,
    Verdict,
    lost_pdl,
)
from sm120fork.verify.proof.stack import VerifyResult
from sm120fork.workspace import Workspace

#: Name lists longer than this are cut in the compact JSON.
NAMES_SHOWN = 5


#: Machine-specific folders in compiler flags, named by role in the committed report.
_ROLES = (
    (re.compile(r"/[^\s\"']*/site-packages/"), "<site-packages>/"),
    (re.compile(r"/[^\s\"']*/include/python3\.\d+"), "<python-include>"),
    (re.compile(r"/usr/local/include"), "<system-include>"),
)


def portable(value: Any, root: Path) -> Any:
    """``value`` with the checkout's path made relative, other machine folders by role."""
    def text(value: str) -> str:
        value = value.replace(f"{root}/", "").replace(str(root), ".")
        for pattern, role in _ROLES:
            value = pattern.sub(role, value)
        return value

    return util_portable.portable(value, text)


def to_json(result: VerifyResult, root: Path) -> Any:
    """``verify-full.json``: the run's dataclasses as JSON data, less this machine's paths."""
    proof = result.proof.document() if result.proof else None
    return portable({
        "stack": result.stack,
        "made_from": [dataclasses.asdict(p) for p in result.provenance],
        "passed": result.passed,
        "seconds": round(result.seconds, 1),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "patches": [dataclasses.asdict(v) for v in result.verdicts],
        "sglang_checks": [dataclasses.asdict(r) for r in result.sglang],
        # the compile proof's verdict per variant and architecture, for upstream_pr
        "verdicts": proof["verdicts"] if proof else [],
        "proof": proof["report"] if proof else None,
    }, root)


def to_markdown(result: VerifyResult) -> str:
    made_from = markdown_table(
        ["project", "series", "series digest", "wheel", "wheel sha256"],
        [[p.project, p.series, p.series_digest[:16], p.wheel, p.wheel_sha256[:16]]
         for p in result.provenance])
    lines = [
        f"# SM120/SM121 verification of the stack {result.stack}",
        "",
        "Produced by `nox -s verify_sm120` (`python -m sm120fork verify-sm120`). No SM120 GPU "
        "was used. Each patch's evidence comes from its `Verified-By` header fields "
        "(patches/README.md): the compile proof on cubins and host objects for sm_120f (the "
        "binary FlashInfer builds for every 12.x GPU), sm_120a and sm_121a against sm_90a; "
        "SGLang behaviour checks on the real patched modules with only the GPU query "
        "stubbed; CPU tests of the suite; committed SM90 GPU runs. Every patch is also "
        "checked in the built wheel (fingerprint). `verify.json` beside this file has the "
        "results with counts; the per-kernel detail is written to "
        "`.forks/reports/sm120/<stack>/verify-full.json` (not committed: several MB).",
        "",
        f"Overall: **{'PASS' if result.passed else 'FAIL'}** in {result.seconds:.0f} s on "
        f"{os.cpu_count()} CPUs ({platform.platform()}).",
        "",
        "Made from:",
        "",
        *made_from,
        "",
        "## Per patch",
        "",
    ]
    lines += markdown_table(
        ["patch", "evidence", "checks", "artifact", "result"],
        [[v.subject, v.evidence, "<br>".join(v.checks), v.artifact,
          "pass" if v.passed else "**FAIL**"] for v in result.verdicts])
    if result.sglang:
        lines += ["", "## SGLang behaviour checks", ""]
        lines += markdown_table(
            ["check", "capability", "expected", "observed", "result"],
            [[r.name, r.capability, f"`{r.expected}`", f"`{r.observed}`",
              "pass" if r.passed else "**FAIL**"] for r in result.sglang])
    if result.proof:
        names = ", ".join(v.name for v in result.proof.variants)
        lines += ["", f"## FlashInfer compile proof ({names} side by side)",
                  render_markdown(result.proof).split("\n", 1)[1]]
    return "\n".join(lines) + "\n"


def compact(document: Any) -> Any:
    """``verify-full.json``'s data with counts and a few names instead of per-kernel
    lists."""
    out = copy.deepcopy(document)
    for verdict in out["verdicts"]:
        for key in ("missing", "empty", "pdl_lost"):
            names = verdict[key]
            verdict[key] = {"count": len(names), "first": names[:NAMES_SHOWN]}
    for variant in (out["proof"] or {}).get("variants", []):
        for arch in variant["archs"]:
            for unit in arch["units"]:
                unit["kernel_count"] = len(unit.pop("kernels"))
    return out


_OUTCOMES = {"pass": "pass", "fail": "fail", "not checked": "skip"}


def to_record(result: VerifyResult, root: Path, *, created: str | None = None) -> Record:
    """The verify-sm120 record: one case per patch, per SGLang behaviour check and per
    compile-proof verdict (variants other than the full series are baselines)."""
    cases = [Case(id=f"{v.project}/{v.patch}", variant=FULL,
                  outcome="pass" if v.passed else "fail", detail=portable(v.evidence, root))
             for v in result.verdicts]
    cases += [Case(id=f"sglang/{c.name}@{c.capability}", variant=FULL,
                   outcome="pass" if c.passed else "fail")
              for c in result.sglang]
    for v in result.proof.verdicts() if result.proof else ():
        status = v.status.value
        reasons = "; ".join(portable(r, root) for r in v.reasons)
        cases.append(Case(id=f"proof/{v.variant}/{v.arch}",
                          variant=FULL if v.variant == FULL else "baseline",
                          outcome=_OUTCOMES.get(status, "error"),
                          detail=(reasons or ("not checked" if status == "not checked" else ""))
                          [:200]))
    cpus = os.cpu_count()
    return make(
        kind="verify-sm120", stack=result.stack,
        command=KINDS["verify-sm120"].command(result.stack),
        created=created or datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"),
        toolkit=__version__,
        machine=Machine(description=f"CPU machine, {cpus} cores, no GPU",
                        python=platform.python_version(), cpus=cpus),
        tested=Tested(wheels=tuple(TestedWheel(variant="patched", project=m.project,
                                               file=m.wheel, sha256=m.wheel_sha256)
                                   for m in result.provenance),
                      trees=tuple(TestedTree(project=m.project, tree=m.tree)
                                  for m in result.provenance if m.tree),
                      patches=result.patches),
        planned=len(cases), cases=tuple(cases),
        notes=(f"took {round(result.seconds, 1):.0f} s",))


def write_reports(ws: Workspace, result: VerifyResult) -> Path:
    """The record in ``reports/``; the full documents in ``.forks/reports/sm120/<stack>/``."""
    document = to_json(result, ws.root)
    full = ws.state_dir / "reports" / "sm120" / result.stack
    full.mkdir(parents=True, exist_ok=True)
    atomic_write_text(full / "verify-full.json", json.dumps(document, indent=1) + "\n")
    atomic_write_text(full / "verify.json", json.dumps(compact(document), indent=1) + "\n")
    atomic_write_text(full / "verify.md", to_markdown(result))
    return write_record(to_record(result, ws.root), ws.reports_dir)


def _column(r: ArchResult | None, v: Verdict, opcodes: Mapping[str, PdlOpcodes]) -> list[str]:
    """One variant's cells of an architecture's summary rows, in their order."""
    gate = "-" if r is None else "accepted" if r.gate.accepted else f"refused: `{r.gate.error}`"
    verdict = f"**{v.status.value.upper()}**"
    calling = r.units_calling(CLUSTER_QUERY) if r is not None else None
    calls = "-" if calling is None else f"{sum(calling.values())} / {len(calling)} units"
    if r is None or not r.compiled:
        return [gate, "not compiled", "-", "-", calls, "-", verdict]
    pdl = "not checked"
    if v.pdl is not None and v.pdl_reference is not None:
        ops = opcodes.get(v.arch)
        names = f" ({'/'.join(ops.wait)} / {'/'.join(ops.launch)})" if ops else ""
        pdl = f"{v.pdl[0]} / {v.pdl[1]} vs {v.pdl_reference[0]} / {v.pdl_reference[1]}{names}"
        if v.pdl_lost:
            pdl += f"; {len(v.pdl_lost)} kernels lost PDL"
    cached = bool(r.units) and all(u.cached for u in r.units)
    return [gate, f"{v.present} / {v.reference_kernels}" + (" (forced)" if r.forced else ""),
            str(len(v.empty)), pdl, calls,
            f"{sum(u.seconds for u in r.units):.1f}" + (" (cached)" if cached else ""), verdict]


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
    host_row = f"host code calls {CLUSTER_QUERY}"  # where host objects were built
    checks = ["JIT gate", f"kernels present / {report.reference_arch}", "empty kernels", "PDL",
              host_row, "compile s", "verdict"]
    rows: list[list[str]] = []
    for arch in report.archs:
        columns = [_column(v.arch(arch), verdicts[(v.name, arch)], opcodes)
                   for v in report.variants]
        rows += [[arch, check, *(c[i] for c in columns)] for i, check in enumerate(checks)
                 if check != host_row or arch in report.host_archs]
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

    def wrongs(kernel: Kernel, arch: str) -> list[str]:
        ref = ref_kernels.get(kernel.name)
        if ref is None or arch == report.reference_arch:
            return []
        return [what for what, wrong in (("empty", is_empty_body(kernel.size, ref.size)),
                                         ("lost PDL", lost_pdl(kernel, ref))) if wrong]

    rows = family_rows([[(k.family, k.size, wrongs(k, r.arch)) for k in r.kernels.values()]
                        for r in compiled])
    header = ["family", *(f"{a.arch}: n / min B / median B" for a in compiled)]
    return markdown_table(header, rows)
