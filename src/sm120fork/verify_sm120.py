"""``verify-sm120``: what each patch of the default stack does, proven without SM120 GPUs.

Three FlashInfer trees (unpatched, F1 only, the full series) go through the compile proof
(:mod:`sm120fork.sm120proof`); the patched and unpatched SGLang trees go through the
behaviour checks (:mod:`sm120fork.verify_sglang`); the build's artifact check supplies
the fingerprint evidence.  The result is one row per patch: what was checked, on which
artifact, pass or fail, plus the compile times, in ``reports/sm120/verify.{md,json}``.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sm120fork.build.publish import ProjectBuild
from sm120fork.build.stack import build_project
from sm120fork.declare import Project, Stack
from sm120fork.errors import VerifyError
from sm120fork.patch.series import Patch, load_series
from sm120fork.patch.tree import prepare_tree
from sm120fork.sm120proof import ProofReport, Status, prove
from sm120fork.verify_sglang import CheckResult, check_sglang
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")
SM12X_ARCHS = ("sm_120a", "sm_121a")
VARIANTS = ("unpatched", "F1 only", "full series")


@dataclass(frozen=True, kw_only=True)
class PatchVerdict:
    patch: str
    subject: str
    checks: tuple[str, ...]
    artifact: str
    passed: bool


def patch_id(patch: Patch) -> str:
    return patch.subject.split()[0]


def _fingerprint_check(build: ProjectBuild, patch: Patch) -> tuple[str, bool]:
    rows = [r for r in build.entry["artifact_check"] if r["patch"] == patch.name]
    ok = bool(rows) and all(r["passed"] for r in rows)
    return (f"fingerprint in wheel, absent upstream ({len(rows)} string(s)): "
            f"{'pass' if ok else 'FAIL'}"), ok


def _proof_checks(report: ProofReport, pid: str) -> tuple[list[str], bool]:
    verdicts = {(v.variant, v.arch): v for v in report.verdicts()}
    gates = {(v.name, a.arch): a.gate for v in report.variants for a in v.archs}
    checks: list[str] = []
    ok = True
    if pid == "F1":
        for arch in SM12X_ARCHS:
            before, after = gates[("unpatched", arch)], gates[("full series", arch)]
            good = (not before.accepted) and after.accepted
            ok &= good
            checks.append(f"JIT gate {arch}: unpatched "
                          f"{'accepts' if before.accepted else 'refuses'}, full series "
                          f"{'accepts' if after.accepted else 'refuses'}")
    elif pid in ("F3", "F5"):
        for arch in SM12X_ARCHS:
            full = verdicts[("full series", arch)]
            f1 = verdicts[("F1 only", arch)]
            good = full.status is Status.PASS
            if pid == "F3":
                good &= bool(f1.empty)
                checks.append(f"{arch}: F1 only has {len(f1.empty)} empty kernels, full series "
                              f"{len(full.empty)} empty, {full.present}/{full.reference_kernels}"
                              f" kernels, PDL {full.pdl} vs sm_90a {full.pdl_reference}: "
                              f"{full.status.value}")
            else:
                checks.append(f"{arch}: the cluster-size query compiles into every kernel "
                              f"launcher ({full.present}/{full.reference_kernels} kernels): "
                              f"{full.status.value}")
            ok &= good
    return checks, ok


def _sglang_checks(results: Sequence[CheckResult], pid: str) -> tuple[list[str], bool]:
    mine = [r for r in results if r.name.startswith(pid)]
    if not mine:
        return [], True
    failed = [r for r in mine if not r.passed]
    caps = sorted({r.capability for r in mine})
    text = (f"{len(mine) - len(failed)}/{len(mine)} behaviour checks pass on the patched "
            f"module (capabilities {', '.join(caps)})")
    if failed:
        text += "; failed: " + ", ".join(f"{r.name}@{r.capability}" for r in failed)
    return [text], not failed


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    verdicts: tuple[PatchVerdict, ...]
    proof: ProofReport
    sglang: tuple[CheckResult, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        unchanged = all(r.passed for r in self.sglang if r.name.startswith("unchanged"))
        return unchanged and all(v.passed for v in self.verdicts)


def _trees(ws: Workspace, stack: Stack, project: Project,
           variants: dict[str, Sequence[Patch]], force: bool) -> dict[str, Path]:
    trees: dict[str, Path] = {}
    for name, patches in variants.items():
        slug = "" if name == "full series" else name.replace(" ", "-").lower()
        trees[name] = prepare_tree(ws, stack, project, patches=patches, variant=slug,
                                   force=force).path
    return trees


def run_verify(ws: Workspace, stack: Stack, *, jobs: int = 2, force: bool = False,
               python: str | None = None) -> VerifyResult:
    start = time.monotonic()
    fi = stack.project("flashinfer")
    sg = stack.project("sglang")
    fi_series = load_series(ws.series_dir(fi)).patches
    f1 = [p for p in fi_series if patch_id(p) == "F1"]
    if len(f1) != 1:
        raise VerifyError("the FlashInfer series needs exactly one patch whose subject starts "
                          "with 'F1'", where=str(ws.series_dir(fi)))
    with ws.lock():
        builds = {p.key: build_project(ws, stack, p, force=force) for p in (fi, sg)}
        fi_trees = _trees(ws, stack, fi, {"unpatched": (), "F1 only": f1,
                                          "full series": fi_series}, force)
        sg_trees = _trees(ws, stack, sg, {"unpatched": (),
                                          "full series": load_series(ws.series_dir(sg)).patches},
                          force)
        log.info("compile proof: 3 FlashInfer variants x sm_90a/%s (cached cubins reused)",
                 "/".join(SM12X_ARCHS))
        proof = prove(fi_trees, archs=("sm_90a", *SM12X_ARCHS),
                      cache_dir=ws.state_dir / "proof", jobs=jobs,
                      force_compile=SM12X_ARCHS, python=python)
        log.info("SGLang behaviour checks (patched vs unpatched)")
        sglang = check_sglang(sg_trees["full series"], baseline=sg_trees["unpatched"],
                              python=python or sys.executable)
    verdicts: list[PatchVerdict] = []
    for project, build in ((fi, builds["flashinfer"]), (sg, builds["sglang"])):
        for patch in load_series(ws.series_dir(project)).patches:
            pid = patch_id(patch)
            fp_text, ok = _fingerprint_check(build, patch)
            checks = [fp_text]
            artifacts = [build.wheel.name]
            if project is fi:
                more, good = _proof_checks(proof, pid)
                if more:
                    artifacts.append("sm_90a/sm_120a/sm_121a cubins of the trtllm comm module")
            else:
                more, good = _sglang_checks(sglang, pid)
                if more:
                    artifacts.append("patched SGLang modules (python/sglang/srt), GPU query "
                                     "stubbed")
            checks += more
            verdicts.append(PatchVerdict(patch=patch.name, subject=patch.subject,
                                         checks=tuple(checks), artifact="; ".join(artifacts),
                                         passed=ok and good))
    return VerifyResult(verdicts=tuple(verdicts), proof=proof, sglang=tuple(sglang),
                        seconds=time.monotonic() - start)


def to_json(result: VerifyResult) -> dict[str, Any]:
    proof = json.loads(result.proof.to_json())
    return {
        "passed": result.passed,
        "seconds": round(result.seconds, 1),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": __import__("os").cpu_count()},
        "patches": [asdict(v) for v in result.verdicts],
        "sglang_checks": [asdict(r) for r in result.sglang],
        # the compile proof's verdict per variant and architecture, for upstream_pr
        "verdicts": proof["verdicts"],
        "proof": proof["report"],
    }


def to_markdown(result: VerifyResult) -> str:
    lines = [
        "# SM120/SM121 verification of the default stack",
        "",
        "Produced by `nox -s verify_sm120` (`python -m sm120fork verify-sm120`). No SM120 GPU "
        "was used: FlashInfer's patches are proven on compiled sm_120a/sm_121a cubins "
        "against sm_90a, SGLang's on the real patched modules with only the GPU query "
        "stubbed, every patch on the built wheel (fingerprint). `verify.json` beside this "
        "file has the results with counts; the per-kernel detail is written to "
        "`.forks/reports/sm120/verify-full.json` (not committed: several MB).",
        "",
        f"Overall: **{'PASS' if result.passed else 'FAIL'}** in {result.seconds:.0f} s on "
        f"{__import__('os').cpu_count()} CPUs ({platform.platform()}).",
        "",
        "## Per patch",
        "",
        "| patch | checks | artifact | result |",
        "| --- | --- | --- | --- |",
    ]
    for v in result.verdicts:
        checks = "<br>".join(c.replace("|", "\\|") for c in v.checks)
        lines.append(f"| {v.subject} | {checks} | {v.artifact} | "
                     f"{'pass' if v.passed else '**FAIL**'} |")
    lines += ["", "## SGLang behaviour checks", "",
              "| check | capability | expected | observed | result |",
              "| --- | --- | --- | --- | --- |"]
    for r in result.sglang:
        lines.append(f"| {r.name} | {r.capability} | `{r.expected}` | `{r.observed}` | "
                     f"{'pass' if r.passed else '**FAIL**'} |")
    proof_md = result.proof.to_markdown().split("\n", 1)[1]
    lines += ["", "## FlashInfer compile proof (unpatched, F1 only, full series side by side)",
              proof_md]
    return "\n".join(lines) + "\n"


#: Name lists longer than this are cut in the committed JSON (the full one keeps them).
NAMES_SHOWN = 5


def compact(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` without per-kernel detail: counts and a few names instead of lists.

    The full document (1449 kernels x 9 builds, several MB) stays in the ignored
    ``.forks/``; the committed report keeps what a reader or upstream_pr needs.
    """
    out: dict[str, Any] = json.loads(json.dumps(document))
    for verdict in out["verdicts"]:
        for key in ("missing", "empty", "pdl_lost"):
            names = verdict[key]
            verdict[key] = {"count": len(names), "first": names[:NAMES_SHOWN]}
    for variant in out["proof"]["variants"]:
        for arch in variant["archs"]:
            for unit in arch["units"]:
                kernels = unit.pop("kernels")
                unit["kernel_count"] = len(kernels)
    return out


def write_reports(ws: Workspace, result: VerifyResult) -> Path:
    out = ws.reports_dir / "sm120"
    out.mkdir(parents=True, exist_ok=True)
    document = to_json(result)
    full = ws.state_dir / "reports" / "sm120"
    full.mkdir(parents=True, exist_ok=True)
    (full / "verify-full.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "verify.json").write_text(json.dumps(compact(document), indent=1) + "\n")
    (out / "verify.md").write_text(to_markdown(result))
    return out
