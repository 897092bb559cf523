"""Which evidence backs each patch: its ``Verified-By`` header fields, each one checked.

``Verified-By: <kind>:<check>`` (one per line, several allowed; patches/README.md):

- ``proof:jit-gate``: the JIT gate refuses every SM12x architecture unpatched and accepts
  it with the full series;
- ``proof:kernel-bodies``: the gate patch alone still compiles empty kernel bodies (or
  loses PDL) on SM12x, the full series has every sm_90a kernel with its body and PDL;
- ``proof:cluster-query``: the host code of every translation unit calls
  ``cudaOccupancyMaxPotentialClusterSize`` with the full series, and not unpatched;
- ``sglang:<prefix>``: the SGLang behaviour checks whose names start with ``<prefix>``;
- ``cpu:<tests/file.py>::<test>``: a CPU test of the suite (it must exist; the suite runs it);
- ``gpu:<report dir>[:<api>]``: a committed GPU report: every run under it found the
  primary variant failing no case, and (with ``<api>``) the A/B fixed some of that API's.

The checks know no project keys or patch names: the header says what proves what.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sm120fork.cuda.arch import is_sm12x
from sm120fork.errors import SeriesError
from sm120fork.patch.series import Patch
from sm120fork.verify.proof.markdown import CLUSTER_QUERY
from sm120fork.verify.proof.verdict import ProofReport, Status

FIELD = "Verified-By"
UNPATCHED = "unpatched"
FULL = "full series"

#: What each kind of evidence is, as the per-patch table calls it.
EVIDENCE_LABELS = {
    "proof": "compile proof",
    "sglang": "CPU behaviour check",
    "cpu": "CPU behaviour check",
    "gpu": "SM90 GPU run",
}
NO_EVIDENCE = "none yet (fingerprint only)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    kind: str
    check: str

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.check}"


def claims(patch: Patch) -> tuple[Claim, ...]:
    """The patch's ``Verified-By`` fields, parsed; a malformed one is an error."""
    out = []
    for name, value in patch.fields:
        if name.lower() != FIELD.lower():
            continue
        kind, sep, check = value.strip().partition(":")
        if not sep or kind not in EVIDENCE_LABELS or not check:
            raise SeriesError(f"bad {FIELD} {value!r}", where=str(patch.path),
                              fix=f"write '{FIELD}: <kind>:<check>' with kind one of "
                                  f"{', '.join(EVIDENCE_LABELS)}")
        out.append(Claim(kind=kind, check=check))
    return tuple(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """One claim, checked: what was looked at and whether it holds."""

    claim: str
    evidence: str
    text: str
    passed: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Context:
    """Everything the checks read: the proof, the behaviour checks, the checkout."""

    root: Path
    proof: ProofReport | None = None
    gate_variant: str | None = None
    #: (name, capability, passed) of every SGLang behaviour check that ran.
    behaviour: tuple[tuple[str, str, bool], ...] = ()


# --------------------------------------------------------------------------- proof checks


def _sm12x(report: ProofReport) -> list[str]:
    return [a for a in report.archs if is_sm12x(a)]


def check_jit_gate(ctx: Context) -> tuple[str, bool]:
    report = ctx.proof
    before, after = (report.variant(UNPATCHED), report.variant(FULL)) if report else (None, None)
    if report is None or before is None or after is None:
        return "no compile proof of the unpatched and fully patched trees", False
    parts, ok = [], True
    for arch in _sm12x(report):
        b, a = before.arch(arch), after.arch(arch)
        if b is None or a is None:
            return f"{arch} missing from the proof", False
        good = not b.gate.accepted and a.gate.accepted
        ok &= good
        parts.append(f"{arch} ({a.gate.arch_list}): unpatched "
                     f"{'accepts' if b.gate.accepted else 'refuses'}, full series "
                     f"{'accepts' if a.gate.accepted else 'refuses'}")
    if not parts:
        return "no SM12x architecture in the proof", False
    return "JIT gate " + "; ".join(parts), ok


def check_kernel_bodies(ctx: Context) -> tuple[str, bool]:
    report = ctx.proof
    if report is None or report.variant(FULL) is None:
        return "no compile proof of the fully patched tree", False
    verdicts = {(v.variant, v.arch): v for v in report.verdicts()}
    parts, ok, shown_before = [], True, False
    for arch in _sm12x(report):
        full = verdicts[(FULL, arch)]
        if full.status is Status.NOT_CHECKED and not full.reference_kernels:
            continue
        ok &= full.status is Status.PASS
        text = (f"{arch}: full series {full.present}/{full.reference_kernels} kernels, "
                f"{len(full.empty)} empty, PDL {full.pdl} vs sm_90a {full.pdl_reference}")
        gate_only = verdicts.get((ctx.gate_variant or "", arch))
        result = report.variant(ctx.gate_variant or "")
        compiled = result is not None and (r := result.arch(arch)) is not None and r.compiled
        if gate_only is not None and compiled:
            shown_before |= bool(gate_only.empty or gate_only.pdl_lost)
            text += (f"; {ctx.gate_variant}: {len(gate_only.empty)} empty, "
                     f"{len(gate_only.pdl_lost)} lost PDL")
        parts.append(f"{text}: {full.status.value}")
    if not parts:
        return "no SM12x build of the fully patched tree", False
    if not shown_before:
        parts.append("the gate patch alone shows no empty kernel or lost PDL on any "
                     "compiled SM12x build")
    return "; ".join(parts), ok and shown_before


def check_cluster_query(ctx: Context) -> tuple[str, bool]:
    report = ctx.proof
    if report is None or not report.host_archs:
        return "no host objects in the compile proof", False
    parts, ok = [], True
    for arch in report.host_archs:
        counts = {}
        for name in (UNPATCHED, FULL):
            variant = report.variant(name)
            result = variant.arch(arch) if variant else None
            counts[name] = result.units_calling(CLUSTER_QUERY) if result else None
        full, before = counts[FULL], counts[UNPATCHED]
        if full is None or before is None:
            parts.append(f"{arch}: host objects missing")
            ok = False
            continue
        good = all(full.values()) and not all(before.values())
        ok &= good
        parts.append(f"{arch}: host code calls {CLUSTER_QUERY} in {sum(full.values())}/"
                     f"{len(full)} translation units with the full series, "
                     f"{sum(before.values())}/{len(before)} unpatched")
    return "; ".join(parts), ok


PROOF_CHECKS: dict[str, Callable[[Context], tuple[str, bool]]] = {
    "jit-gate": check_jit_gate,
    "kernel-bodies": check_kernel_bodies,
    "cluster-query": check_cluster_query,
}


# --------------------------------------------------------------------------- other kinds


def check_behaviour(ctx: Context, prefix: str) -> tuple[str, bool]:
    mine = [(n, c, p) for n, c, p in ctx.behaviour if n.startswith(prefix)]
    if not mine:
        return f"no behaviour check named {prefix}* ran", False
    failed = [f"{n}@{c}" for n, c, p in mine if not p]
    caps = sorted({c for _, c, _ in mine})
    text = (f"{len(mine) - len(failed)}/{len(mine)} behaviour checks {prefix}* pass on the "
            f"patched module (capabilities {', '.join(caps)})")
    return text + (f"; failed: {', '.join(failed)}" if failed else ""), not failed


def check_cpu_test(ctx: Context, node: str) -> tuple[str, bool]:
    """The named test exists (a function of that name in that file of the suite)."""
    file, sep, name = node.partition("::")
    path = ctx.root / file
    if not sep or not path.is_file():
        return f"{node}: no such test file", False
    tree = ast.parse(path.read_text(), filename=str(path))
    found = any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)
    return f"{node} (run by the test suite)" + ("" if found else ": no such test"), found


def check_gpu_report(ctx: Context, spec: str) -> tuple[str, bool]:
    """Every ``test-ab.json`` under the report dir: the primary variant failed no case; with
    an API named, the A/B fixed some of its cases (failing on the baseline, passing here)."""
    where, _, api = spec.partition(":")
    reports = sorted((ctx.root / where).rglob("test-ab.json"))
    if not reports:
        return f"{where}: no committed test-ab.json", False
    cases = failed = fixed = 0
    wheels: set[str] = set()
    for path in reports:
        document = json.loads(path.read_text())
        results = document["results"]
        primary = results[document["primary"]]
        wheels.add(str(document.get("variants", {}).get(document["primary"], {})
                       .get("sha256") or "?")[:12])
        mine = [r for r in primary if not api or r["case"]["api"] == api]
        cases += sum(r["status"] != "skip" for r in mine)
        failed += sum(r["status"] == "fail" for r in mine)
        baseline = results.get(document.get("baseline") or "", [])
        before = {r["key"]: r["status"] for r in baseline}
        fixed += sum(r["status"] == "pass" and before.get(r["key"]) == "fail" for r in mine)
    what = f" {api}" if api else ""
    text = (f"{where}: {len(reports)} run(s), {cases}{what} cases, {failed} failing"
            + (f", {fixed} fixed against the baseline" if api else "")
            + f" (wheel sha256 {', '.join(sorted(wheels))})")
    return text, cases > 0 and failed == 0 and (fixed > 0 or not api)


def check(claim: Claim, ctx: Context) -> Outcome:
    if claim.kind == "proof":
        fn = PROOF_CHECKS.get(claim.check)
        text, ok = (fn(ctx) if fn else
                    (f"unknown proof check {claim.check!r} (known: {', '.join(PROOF_CHECKS)})",
                     False))
    elif claim.kind == "sglang":
        text, ok = check_behaviour(ctx, claim.check)
    elif claim.kind == "cpu":
        text, ok = check_cpu_test(ctx, claim.check)
    else:
        text, ok = check_gpu_report(ctx, claim.check)
    return Outcome(claim=claim.text, evidence=EVIDENCE_LABELS[claim.kind], text=text,
                   passed=ok)


def evidence_label(outcomes: Sequence[Outcome]) -> str:
    labels = list(dict.fromkeys(o.evidence for o in outcomes))
    return " + ".join(labels) if labels else NO_EVIDENCE


def needs(patches: Mapping[str, Sequence[Patch]], kind: str) -> list[str]:
    """The projects with at least one patch claiming evidence of ``kind``."""
    return [project for project, series in patches.items()
            if any(c.kind == kind for p in series for c in claims(p))]
