"""``verify-sm120`` for one stack: every patch's evidence, checked, without SM120 GPUs
(the compile proof runs on three trees: unpatched, the ``proof:jit-gate`` patches alone,
the full series); its record (``reports/<stack>/verify-sm120/``) and the full report in
``.forks/reports/sm120/<stack>/`` (the compile proof as markdown: variants side by side per
architecture, then detail)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import json
import logging
import os
import platform
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sm120fork import __version__
from sm120fork.cuda.cubin import (
    EMPTY_BODY_BYTES,
    EMPTY_BODY_FRACTION,
    LARGE_BODY_BYTES,
    REFERENCE_ARCH,
    SHIPPED_SM12X_ARCH,
    Kernel,
    PdlOpcodes,
    family_rows,
    is_empty_body,
)
from sm120fork.declare import Stack
from sm120fork.errors import VerifyError
from sm120fork.gpu.layer import run as layer_run
from sm120fork.layouts import LAYOUTS, adapter
from sm120fork.layouts.results import CheckResult
from sm120fork.package.kinds import Options
from sm120fork.package.publish import ProjectBuild
from sm120fork.package.stack import build, fetch, load
from sm120fork.patch.series import Patch
from sm120fork.patch.tree import prepare_tree
from sm120fork.record import (
    KINDS,
    Case,
    Machine,
    Record,
    Tested,
    TestedPatch,
    TestedTree,
    TestedWheel,
    make,
)
from sm120fork.record import write as write_record
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import claims
from sm120fork.util import portable as util_portable
from sm120fork.util.files import atomic_write_text
from sm120fork.util.portable import markdown_table
from sm120fork.verify.proof.patches import (
    FULL,
    UNPATCHED,
    Context,
    Outcome,
    check,
    evidence_label,
    needs,
    run_cpu_tests,
)
from sm120fork.verify.proof.run import (
    CLUSTER_QUERY,
    ArchResult,
    ProofReport,
    VariantResult,
    Verdict,
    lost_pdl,
    prove,
)
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

#: sm_90a the reference; sm_120f what FlashInfer builds for every 12.x GPU; sm_120a and
#: sm_121a the arch-specific neighbours.
PROOF_ARCHS = (REFERENCE_ARCH, SHIPPED_SM12X_ARCH, "sm_120a", "sm_121a")
#: Where the trees that only show the "before" are compiled.
BEFORE_ARCHS = (REFERENCE_ARCH, SHIPPED_SM12X_ARCH)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PatchVerdict:
    project: str
    patch: str
    subject: str
    checks: tuple[str, ...]
    artifact: str
    #: What backs the patch beyond its fingerprint (compile proof, CPU behaviour check...).
    evidence: str
    passed: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Provenance:
    project: str
    series: str
    series_digest: str
    wheel: str
    wheel_sha256: str
    tree: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyResult:
    stack: str
    provenance: tuple[Provenance, ...]
    verdicts: tuple[PatchVerdict, ...]
    proof: ProofReport | None
    sglang: tuple[CheckResult, ...]
    seconds: float
    patches: tuple[TestedPatch, ...] = ()

    @property
    def passed(self) -> bool:
        unchanged = all(r.passed for r in self.sglang if r.name.startswith("unchanged"))
        return unchanged and all(v.passed for v in self.verdicts)


def _verdicts(builds: Mapping[str, list[ProjectBuild]], patches: Mapping[str, Sequence[Patch]],
              ctx: Context, archs: Sequence[str]) -> tuple[PatchVerdict, ...]:
    what_checked = {"proof": f"{'/'.join(archs)} cubins and {SHIPPED_SM12X_ARCH} host objects "
                             "of the trtllm comm module",
                    "sglang": "patched SGLang modules, GPU query stubbed"}
    verdicts: list[PatchVerdict] = []
    for key, made in builds.items():
        where = "wheel" if len(made) == 1 else f"each of {len(made)} wheels"
        for patch in patches[key]:
            per_wheel = [[r for r in b.entry.artifact_check if r.patch == patch.name]
                         for b in made]
            fp_ok = bool(per_wheel) and all(rows and all(r.passed for r in rows)
                                            for rows in per_wheel)
            fp_text = (f"fingerprint in {where}, absent upstream "
                       f"({len(per_wheel[0]) if per_wheel else 0} string(s)): "
                       f"{'pass' if fp_ok else 'FAIL'}")
            outcomes: list[Outcome] = [check(c, ctx, patch, key) for c in claims(patch)]
            kinds = {c.kind for c in claims(patch)}
            artifacts = [", ".join(b.wheel.name for b in made),
                         *(text for kind, text in what_checked.items() if kind in kinds)]
            verdicts.append(PatchVerdict(
                project=key, patch=patch.name, subject=patch.subject,
                checks=(fp_text, *(f"[{o.claim}] {o.text}: {'pass' if o.passed else 'FAIL'}"
                                   for o in outcomes)),
                artifact="; ".join(artifacts), evidence=evidence_label(outcomes),
                passed=fp_ok and all(o.passed for o in outcomes)))
    return tuple(verdicts)


def run_verify(ws: Workspace, stack: Stack, *, jobs: int = 2, force: bool = False,
               python: str | None = None,
               archs: Sequence[str] = PROOF_ARCHS) -> VerifyResult:
    """``archs``: the compile proof's architectures (sm_90a and sm_120f always among them)."""
    start = time.monotonic()
    archs = tuple(dict.fromkeys((*BEFORE_ARCHS, *archs)))
    resolved = ResolvedStack.of(ws, stack)  # its series, read once for build and checks
    plan = load(resolved, Options(force=force, jobs=1))
    series = {i.project.key: i.series for i in plan.projects}
    patches = {key: s.patches for key, s in series.items()}

    @functools.cache
    def tree(key: str, patches: tuple[Patch, ...], variant: str) -> Path:
        """A tree checked beside the build's (unpatched, a gate alone...), made once."""
        slug = "" if variant == FULL else variant.replace(" ", "-").lower()
        return prepare_tree(ws, stack, stack.project(key), patches=patches, variant=slug,
                            force=force).path

    proof_projects = needs(patches, "proof")
    if len(proof_projects) > 1:
        raise VerifyError(f"patches of {', '.join(proof_projects)} claim proof:* evidence; "
                          "the compile proof covers one project", where=f"stack {stack.name}")
    proof: ProofReport | None = None
    gate_variant: str | None = None
    sglang: list[CheckResult] = []
    with ws.lock():
        built = build(fetch(plan))
        builds = {key: [b for b in built.builds if b.project == key] for key in patches}
        for key in proof_projects:
            gate = tuple(p for p in patches[key]
                         if any(c.text == "proof:jit-gate" for c in claims(p)))
            trees = {UNPATCHED: tree(key, (), UNPATCHED)}
            if gate:
                gate_variant = "+".join(p.subject.split()[0] for p in gate) + " only"
                trees[gate_variant] = tree(key, gate, gate_variant)
            trees[FULL] = tree(key, patches[key], FULL)
            log.info("compile proof of %s: %s x %s (cached cubins reused)", key,
                     ", ".join(trees), "/".join(archs))
            proof = prove(trees, archs=archs, cache_dir=ws.state_dir / "proof",
                          jobs=jobs, compile_archs={v: BEFORE_ARCHS for v in trees if v != FULL},
                          force_compile=(SHIPPED_SM12X_ARCH,),
                          host_archs=(SHIPPED_SM12X_ARCH,), python=python)
        for key in needs(patches, "sglang"):
            project = stack.project(key)
            if not project.layout:
                raise VerifyError(f"patches of {key} claim sglang:* evidence, but the project "
                                  "names no upstream layout to check them with",
                                  where=str(stack.path),
                                  fix=f"set projects.{key}.layout (one of: "
                                      f"{', '.join(LAYOUTS)})")
            log.info("SGLang behaviour checks of %s (layout %s, patched vs unpatched)", key,
                     project.layout)
            sglang += adapter(project.layout).check(
                tree(key, patches[key], FULL), baseline=tree(key, (), UNPATCHED),
                python=python or sys.executable, cache=ws.state_dir / "probe",
                layer=layer_run.run_case)
    cpu_nodes = [c.check for series_ in patches.values() for p in series_ for c in claims(p)
                 if c.kind == "cpu"]
    if cpu_nodes:
        log.info("CPU tests named as evidence: %s", ", ".join(cpu_nodes))
    ctx = Context(root=ws.root, proof=proof, gate_variant=gate_variant,
                  behaviour=tuple((r.name, r.capability, r.passed) for r in sglang),
                  cpu=run_cpu_tests(ws.root, cpu_nodes, stack=stack.name),
                  stack=stack.name, today=resolved)
    verdicts = _verdicts(builds, patches, ctx, archs)
    # One line per project, named by its first wheel (the others hold the same files).
    provenance = tuple(
        Provenance(project=key, series=stack.project(key).series,
                   series_digest=series[key].digest, wheel=made[0].wheel.name,
                   wheel_sha256=made[0].sha256, tree=made[0].entry.tree)
        for key, made in builds.items())
    return VerifyResult(stack=stack.name, provenance=provenance, verdicts=verdicts,
                        proof=proof, sglang=tuple(sglang), seconds=time.monotonic() - start,
                        patches=tuple(TestedPatch(project=key, patch=p.name,
                                                  patch_id=p.patch_id)
                                      for key, s in series.items() for p in s.patches))


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
            verdict[key] = {"count": len(verdict[key]), "first": verdict[key][:NAMES_SHOWN]}
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
