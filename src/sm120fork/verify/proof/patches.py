"""Each patch's ``Verified-By: <kind>:<check>`` header fields (patches/README.md), checked;
the checks know no project keys or patch names."""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from xml.etree import ElementTree

from sm120fork.cuda.cubin import is_sm12x
from sm120fork.patch.series import Patch
from sm120fork.record import BASELINE_VARIANTS, KINDS, RECORD_FILE
from sm120fork.record import read as read_record
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import (
    EVIDENCE_LABELS,
    Claim,
    claim_record_path,
    claims,
    twin_record,
)
from sm120fork.util import proc
from sm120fork.verify.proof.run import CLUSTER_QUERY, ProofReport, Status

UNPATCHED = "unpatched"
FULL = "full series"
NO_EVIDENCE = "none yet (fingerprint only)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    claim: str
    evidence: str
    text: str
    passed: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Context:
    root: Path
    proof: ProofReport | None = None
    gate_variant: str | None = None
    #: (name, capability, passed) of every SGLang behaviour check that ran.
    behaviour: tuple[tuple[str, str, bool], ...] = ()
    #: node -> (what happened, passed) of the ``cpu:`` tests already run (run_cpu_tests).
    cpu: Mapping[str, tuple[str, bool]] = dataclasses.field(default_factory=dict)
    #: The stack verified: another stack's record backs nothing, unless it ran this very
    #: build (``today``).
    stack: str = ""
    today: ResolvedStack | None = None


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
        ok &= not b.gate.accepted and a.gate.accepted
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
        results = [v.arch(arch) if (v := report.variant(n)) else None for n in (FULL, UNPATCHED)]
        full, before = (r.units_calling(CLUSTER_QUERY) if r else None for r in results)
        if full is None or before is None:
            parts.append(f"{arch}: host objects missing")
            ok = False
            continue
        ok &= all(full.values()) and not all(before.values())
        parts.append(f"{arch}: host code calls {CLUSTER_QUERY} in {sum(full.values())}/"
                     f"{len(full)} translation units with the full series, "
                     f"{sum(before.values())}/{len(before)} unpatched")
    return "; ".join(parts), ok


PROOF_CHECKS: dict[str, Callable[[Context], tuple[str, bool]]] = {
    "jit-gate": check_jit_gate,
    "kernel-bodies": check_kernel_bodies,
    "cluster-query": check_cluster_query,
}


def check_behaviour(ctx: Context, prefix: str) -> tuple[str, bool]:
    mine = [(n, c, p) for n, c, p in ctx.behaviour if n.startswith(prefix)]
    if not mine:
        return f"no behaviour check named {prefix}* ran", False
    failed = [f"{n}@{c}" for n, c, p in mine if not p]
    caps = sorted({c for _, c, _ in mine})
    text = (f"{len(mine) - len(failed)}/{len(mine)} behaviour checks {prefix}* pass on the "
            f"patched module (capabilities {', '.join(caps)})")
    return text + (f"; failed: {', '.join(failed)}" if failed else ""), not failed


def suite_node(root: Path, node: str) -> str:
    """``node`` as pytest names it: ``tests/<file>.py::<test>`` of a module that lives in a
    stage folder (``tests/<stage>/<file>.py``) is that module's, else ``node`` as written."""
    file, sep, name = node.partition("::")
    parts = Path(file).parts
    if not sep or (root / file).is_file() or len(parts) != 2 or parts[0] != "tests":
        return node
    found = sorted((root / "tests").glob(f"*/{parts[1]}"))
    return f"{found[0].relative_to(root).as_posix()}::{name}" if len(found) == 1 else node


#: The JUnit property naming the stack whose build a test ran (tests/conftest.py).
RUNS_STACK = "runs_stack"
#: The stack a claim's test is run for (tests/helpers_sglang.py builds that one).
VERIFY_STACK_ENV = "SM120FORK_VERIFY_STACK"


def _junit_outcomes(xml: Path, stack: str | None) -> dict[str, tuple[str, bool]]:
    """node -> (outcome, passed) from pytest's JUnit XML; a test that ran another stack's
    build than ``stack`` backs nothing."""
    found: dict[str, tuple[str, bool]] = {}
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        ran_on = [p.get("value", "") for p in case.iter("property")
                  if p.get("name") == RUNS_STACK]
        if stack and ran_on and stack not in ran_on:
            found[node] = (f"ran stack {', '.join(ran_on)}'s build, not {stack}'s: it does "
                           f"not count for stack {stack} (the test builds a stack by name: "
                           f"let it build the one {VERIFY_STACK_ENV} names, as "
                           "tests/helpers_sglang.py does)", False)
            continue
        words = {"failure": "failed", "error": "error", "skipped": "skipped"}
        bad = next((c for c in case if c.tag in words), None)
        if bad is None:
            found[node] = (f"passed ({float(case.get('time') or 0):.0f} s)", True)
            continue
        message = (bad.get("message") or bad.text or "").strip().splitlines()
        found[node] = (f"{words[bad.tag]}: {message[0][:200] if message else '?'}", False)
    return found


def run_cpu_tests(root: Path, nodes: Sequence[str], *, stack: str | None = None
                  ) -> dict[str, tuple[str, bool]]:
    """Run the named tests of the checkout's suite for ``stack`` in one pytest; each one's
    outcome (only a test that ran and passed here is evidence)."""
    results: dict[str, tuple[str, bool]] = {}
    runnable: dict[str, str] = {}  # node as written -> as pytest names it
    for node in dict.fromkeys(nodes):
        file, sep, name = suite_node(root, node).partition("::")
        path = root / file
        if not sep or not path.is_file():
            results[node] = (f"{node}: no such test file", False)
        elif not any(isinstance(n, ast.FunctionDef) and n.name == name
                     for n in ast.parse(path.read_text(), filename=str(path)).body):
            results[node] = (f"{node}: no such test", False)
        else:
            runnable[node] = f"{file}::{name}"
    if not runnable:
        return results
    with tempfile.TemporaryDirectory(prefix="sm120fork-cpu-evidence-") as tmp:
        xml = Path(tmp) / "junit.xml"
        src = str(root / "src")
        pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
        done = proc.run([sys.executable, "-m", "pytest", *runnable.values(), "-q",
                         "-p", "no:cacheprovider", f"--junitxml={xml}"],
                        cwd=root, env={"PYTHONPATH": pythonpath,
                                       **({VERIFY_STACK_ENV: stack} if stack else {})},
                        check=False, timeout=3600)
        ran = _junit_outcomes(xml, stack) if xml.is_file() else {}
    for node, actual in runnable.items():
        results[node] = ran.get(actual) or (
            f"did not run (pytest exit {done.returncode}: "
            f"{(done.stdout + done.stderr).strip().splitlines()[-1:] or ['no output']})",
            False)
    return results


def check_cpu_test(ctx: Context, node: str) -> tuple[str, bool]:
    text, ok = (ctx.cpu[node] if node in ctx.cpu else
                run_cpu_tests(ctx.root, [node], stack=ctx.stack or None)[node])
    return f"{node}: {text}" if not text.startswith(node) else text, ok


def check_gpu_report(ctx: Context, spec: str, patch: Patch | None = None,
                     project: str = "") -> tuple[str, bool]:
    """The stack's record the claim names: of this patch's change as it is now, finished,
    failing no case; with an API named, the A/B fixed some of that API's cases."""
    where, api = claim_record_path("gpu", spec, ctx.stack)
    path = ctx.root / where / RECORD_FILE
    kind, *subject = Path(where).parts[2:4]
    twin = None if path.is_file() or not ctx.today else twin_record(
        ctx.today, kind, subject[0] if subject else None)
    if twin is not None:
        where, rec = twin
    elif not path.is_file():
        return f"{where}: no {RECORD_FILE}", False
    else:
        rec = read_record(path, shown=f"{where}/{RECORD_FILE}")
    if rec.stack != ctx.stack and twin is None:
        return (f"{where} ran on stack {rec.stack}'s build: it does not count for stack "
                f"{ctx.stack} (make it there: "
                f"{KINDS[rec.kind].command(ctx.stack, rec.subject)})"), False
    if patch is not None and patch.patch_id not in {
            p.patch_id for p in rec.tested.patches_of(project)}:
        return (f"{where} was made before this patch's change (patch-id "
                f"{patch.patch_id[:12]} not in it; re-make: {rec.remake})"), False
    mine = [c for c in rec.cases if c.variant not in BASELINE_VARIANTS
            and (not api or c.id.startswith(f"{api}/"))]
    ran = sum(c.outcome != "skip" for c in mine)
    failed = sum(c.outcome in ("fail", "error") for c in mine)
    fixed = sum(c.against == "fixed" for c in mine)
    wheels = sorted({w.sha256[:12] for w in rec.tested.wheels
                     if w.variant not in BASELINE_VARIANTS})
    what = f" {api}" if api else ""
    text = (f"{where}{' (this very build, ran as stack ' + rec.stack + ')' if twin else ''}: "
            f"{rec.verdict}, {ran}{what} cases ran, {failed} failing"
            + (f", {fixed} fixed against the baseline" if api else "")
            + ("" if rec.finished else ", not finished")
            + f" (wheel sha256 {', '.join(wheels) or 'none'})")
    return text, rec.finished and ran > 0 and failed == 0 and (fixed > 0 or not api)


def check(claim: Claim, ctx: Context, patch: Patch | None = None,
          project: str = "") -> Outcome:
    if claim.kind == "proof":
        fn = PROOF_CHECKS.get(claim.check)
        text, ok = fn(ctx) if fn else (
            f"unknown proof check {claim.check!r} (known: {', '.join(PROOF_CHECKS)})", False)
    elif claim.kind == "sglang":
        text, ok = check_behaviour(ctx, claim.check)
    elif claim.kind == "cpu":
        text, ok = check_cpu_test(ctx, claim.check)
    else:
        text, ok = check_gpu_report(ctx, claim.check, patch, project)
    return Outcome(claim=claim.text, evidence=EVIDENCE_LABELS[claim.kind], text=text,
                   passed=ok)


def evidence_label(outcomes: Sequence[Outcome]) -> str:
    labels = list(dict.fromkeys(o.evidence for o in outcomes))
    return " + ".join(labels) if labels else NO_EVIDENCE


def needs(patches: Mapping[str, Sequence[Patch]], kind: str) -> list[str]:
    """The projects with at least one patch claiming evidence of ``kind``."""
    return [project for project, series in patches.items()
            if any(c.kind == kind for p in series for c in claims(p))]

