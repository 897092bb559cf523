"""``verify-sm120`` for one stack: every patch's evidence, checked, without SM120 GPUs
(the compile proof runs on three trees: unpatched, the ``proof:jit-gate`` patches alone,
the full series)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sm120fork.cuda.cubin import REFERENCE_ARCH, SHIPPED_SM12X_ARCH
from sm120fork.declare import Stack
from sm120fork.errors import VerifyError
from sm120fork.gpu.layer import run as layer_run
from sm120fork.layouts import LAYOUTS, adapter
from sm120fork.layouts.results import CheckResult
from sm120fork.package.publish import ProjectBuild
from sm120fork.package.stack import Options, build, fetch, load
from sm120fork.patch.series import Patch
from sm120fork.patch.tree import prepare_tree
from sm120fork.record import TestedPatch
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import claims
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
from sm120fork.verify.proof.run import ProofReport, prove
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
    plan = load(resolved)
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
        built = build(fetch(plan, Options(force=force, jobs=1)), Options(force=force, jobs=1))
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
