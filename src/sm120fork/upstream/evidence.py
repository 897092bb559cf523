"""The evidence an upstream PR carries, gathered and checked: refused when missing, stale or
failing.

The wheel manifest and the stack's records (``reports/<stack>/<kind>/record.json``): the
verify-sm120 record (per-patch checks and the SM120 compile proof), the GPU A/B
(``gpu-test``), SGLang's layer path (``sglang-layer``, for an SGLang PR) and the bench.
A record counts when it is current (:mod:`sm120fork.standing`: made from the patches'
changes as they are today and, where the wheels are built here, from these wheels), so a
reworded Description or a new ``Verified-By`` line stales nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120fork import manifest as manifest_file
from sm120fork.declare import Project, Stack
from sm120fork.errors import MaintenanceError
from sm120fork.manifest import ManifestEntry
from sm120fork.record import BASELINE_VARIANTS, RECORD_FILE, Record
from sm120fork.standing import Today, record_problems, stack_records
from sm120fork.util.hint import command
from sm120fork.util.markdown import markdown_table as _md_table
from sm120fork.workspace import Workspace

#: The verify-sm120 record's variant that judges the series (others are baselines).
FULL_SERIES = "full series"


@dataclass(frozen=True, kw_only=True)
class Evidence:
    manifest_entry: ManifestEntry | None
    manifest_wheels: tuple[ManifestEntry, ...]
    #: The verify-sm120 record of the stack.
    verify: Record
    verify_path: Path
    #: (record.json, record) of the GPU A/B of today's build.
    gpu_tests: list[tuple[Path, Record]]
    #: SGLang's layer path on a GPU (the fault matrix) of today's build.
    layer: list[tuple[Path, Record]]
    #: The bench of today's build.
    bench: list[tuple[Path, Record]]
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256
    manifest_name: str = "wheels/<stack>/manifest.json"
    stack: str = ""
    project: str = ""
    #: The patches of the PR (file names; None: every patch of the project).
    patches: tuple[str, ...] | None = None
    #: Why a bench record of the stack is not of today's build.
    bench_history: tuple[str, ...] = ()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rerun_command(kind: str, stack: str) -> str:
    """The one command that re-makes ``kind`` of evidence of ``stack``, in the form the user
    has (``verify``, ``test``, ``layer``, ``bench``; the GPU kinds on a machine with GPUs,
    after the stack's build, then ``record import``)."""
    if kind == "verify":
        return command("verify-sm120", "--stack", stack)
    if kind == "test":
        return command("gpu test", "--stack", stack, "--quick", "--world-sizes", "2")
    if kind == "layer":
        return command("gpu sglang-layer", "--stack", stack)
    return command("gpu bench", "--stack", stack, "--quick", "--world-size", "2")


#: The record kind of each kind of evidence upstream_pr asks for.
RECORD_KIND = {"verify": "verify-sm120", "test": "gpu-test", "layer": "sglang-layer",
               "bench": "bench"}


def _records(ws: Workspace, stack: Stack, kind: str) -> list[tuple[Path, Record]]:
    return [(ws.root / folder / RECORD_FILE, rec) for folder, rec in
            stack_records(ws, stack.name) if rec.kind == RECORD_KIND[kind]]


def _stale(ws: Workspace, path: Path, rec: Record, today: Today) -> str:
    """Why ``rec`` is not evidence of today's build ("" when it is)."""
    problems = record_problems(rec, today)
    if not problems:
        return ""
    return f"{path.relative_to(ws.root).as_posix()} is stale: {'; '.join(problems)}"


def _judged(rec: Record) -> list[Any]:
    return [c for c in rec.cases if c.variant not in BASELINE_VARIANTS]


def _verify_problems(shown: str, verify: Record, project: Project, stack: str,
                     patches: Sequence[str] | None = None) -> list[str]:
    """What the verify-sm120 record says against ``project``'s PR.

    Each of the project's patches must have passed its checks there; the compile proof's
    verdicts are required only where a patch names the proof as its evidence (a stack
    whose FlashInfer needs no patch, or whose patches claim GPU runs, has none).
    """
    rerun = rerun_command("verify", stack)
    prefix = f"{project.key}/"
    mine = [c for c in verify.cases if c.id.startswith(prefix)
            and (patches is None or c.id[len(prefix):] in patches)]
    proof = [c for c in verify.cases if c.id.startswith("proof/")]
    failing = [c.id.removeprefix("proof/") for c in proof
               if c.variant not in BASELINE_VARIANTS and c.outcome == "fail"]
    if failing:
        return [f"the SM120 compile proof fails for {', '.join(failing)}"]
    if not mine:
        return [f"{shown} has no check of a {project.key} patch (re-run: {rerun})"]
    if bad := [c.id[len(prefix):] for c in mine if c.outcome != "pass"]:
        return [f"{shown} says {', '.join(bad)} failed its checks"]
    if any("compile proof" in c.detail for c in mine) and not proof:
        return [f"{shown} names the compile proof but holds no verdicts (re-run: {rerun})"]
    return []


def _run_problems(rel: str, rec: Record, what: str, rerun: str) -> list[str]:
    judged = _judged(rec)
    failed = [c.id + (" (hung)" if c.detail == "hung" else "") for c in judged
              if c.outcome in ("fail", "error")]
    if failed:
        return [f"{what} failed in {rel}: {len(failed)} case(s), e.g. {', '.join(failed[:3])} "
                f"(once fixed, re-run: {rerun})"]
    if not any(c.outcome == "pass" for c in judged):
        return [f"{rel} ran no case (re-run: {rerun})"]
    if not rec.finished:
        return [f"{rel} did not finish: {rec.planned - len(rec.cases)} planned case(s) not "
                f"run (re-run: {rerun})"]
    return []


def _gather(ws: Workspace, stack: Stack, kind: str, today: Today, what: str,
            files: dict[str, str], problems: list[str], *, required: bool = True
            ) -> tuple[list[tuple[Path, Record]], list[str]]:
    """Current records of ``kind``, each judged; and why the others are not evidence."""
    rerun = rerun_command(kind, stack.name)
    found: list[tuple[Path, Record]] = []
    history: list[str] = []
    for path, rec in _records(ws, stack, kind):
        rel = path.relative_to(ws.root).as_posix()
        if why := _stale(ws, path, rec, today):
            history.append(why)
            continue
        files[rel] = _sha256(path)
        if kind != "bench":
            problems.extend(_run_problems(rel, rec, what, rerun))
        found.append((path, rec))
    if not found and required:
        problems.append(f"no {what} of stack {stack.name}'s current build in "
                        f"reports/{stack.name}/{RECORD_KIND[kind]}/ (on a machine with a GPU, "
                        f"run: {rerun}; then {command('record import', 'DIR')})"
                        + "".join(f"; {h}" for h in history))
    return found, history


def collect_evidence(ws: Workspace, today: Today, project: Project,
                     patches: Sequence[str] | None = None) -> Evidence:
    """Gather the evidence of ``project`` of the stack as resolved in ``today`` (its
    series and build manifest, read once by the caller), or refuse naming everything
    missing, stale or failing, each with the one command that re-makes it."""
    problems: list[str] = []
    files: dict[str, str] = {}
    stack = today.stack
    series_digest = today.series[project.key].digest
    manifest_path = today.manifest_path or ws.stack_wheels(stack.name) / manifest_file.FILE
    wheels_dir = (manifest_path.parent
                  if manifest_path.parent != ws.stack_wheels(stack.name) else None)
    shown = os.path.relpath(manifest_path, ws.root)
    manifest = today.built
    entry: ManifestEntry | None = None
    wheels: tuple[ManifestEntry, ...] = ()
    if manifest is None:
        problems.append(f"no {shown} (run: "
                        + command("build", "--stack", stack.name,
                                  *(["--out", os.path.relpath(manifest_path.parent, ws.root)]
                                    if wheels_dir else [])) + ")")
    elif manifest.stack != stack.name:
        problems.append(f"{shown} is for stack {manifest.stack!r}, not "
                        f"{stack.name!r} (build this stack, or pass --wheels)")
    else:
        wheels = manifest.wheels
        entry = manifest.first(project.key)
        if entry is None:
            problems.append(f"{shown} has no {project.key} wheel")
        elif entry.series_digest != series_digest:
            problems.append(f"the {project.key} wheel was built from another series "
                            f"(run: {command('build', '--stack', stack.name)})")
        elif not all(r.passed for r in entry.artifact_check):
            problems.append(f"the {project.key} wheel failed its artifact check")
        files[shown] = _sha256(manifest_path)
    verify_path = ws.reports_dir / stack.name / RECORD_KIND["verify"] / RECORD_FILE
    verify_shown = verify_path.relative_to(ws.root).as_posix()
    verify_records = _records(ws, stack, "verify")
    verify = verify_records[0][1] if verify_records else None
    if verify is None:
        problems.append(f"no SM120 compile proof of stack {stack.name} {verify_shown} "
                        f"(run: {rerun_command('verify', stack.name)})")
    elif why := _stale(ws, verify_path, verify, today):
        problems.append(f"{why} (re-run: {rerun_command('verify', stack.name)})")
    else:
        files[verify_shown] = _sha256(verify_path)
        problems += _verify_problems(verify_shown, verify, project, stack.name, patches)
    gpu_tests, _ = _gather(ws, stack, "test", today, "GPU test results", files, problems)
    layer: list[tuple[Path, Record]] = []
    if project.normalized_name == "sglang":
        layer, _ = _gather(ws, stack, "layer", today,
                           "GPU run of SGLang's layer path (the fault matrix)", files, problems)
    bench, bench_history = _gather(ws, stack, "bench", today, "bench", files, problems,
                                   required=False)
    if problems or verify is None:
        raise MaintenanceError(
            "refusing to prepare an upstream PR: " + "; ".join(problems),
            where=f"{stack.name}/{project.key}",
            fix="produce the missing evidence (or fix what failed) and run upstream_pr again")
    return Evidence(manifest_entry=entry, manifest_wheels=wheels, verify=verify,
                    verify_path=verify_path, gpu_tests=gpu_tests, layer=layer, bench=bench,
                    files=files, project=project.key,
                    patches=tuple(patches) if patches is not None else None,
                    manifest_name=shown, stack=stack.name, bench_history=tuple(bench_history))


def _counts(rec: Record) -> str:
    c = rec.counts
    return ", ".join(f"{c[k]} {k}" for k in ("pass", "fail", "skip", "error") if c[k]) \
        or "no cases"


def evidence_sections(ws: Workspace, ev: Evidence) -> dict[str, list[str]]:
    verify_shown = ev.verify_path.relative_to(ws.root).as_posix()
    prefix = f"{ev.project}/"
    mine = [c for c in ev.verify.cases if c.id.startswith(prefix)
            and (ev.patches is None or c.id[len(prefix):] in ev.patches)]
    patch_rows = [[c.id[len(prefix):], c.detail, c.outcome] for c in mine]
    verdict_rows = []
    if any("compile proof" in c.detail for c in mine):  # a patch of this PR stands on it
        for c in ev.verify.cases:
            if c.id.startswith("proof/"):
                variant, _, arch = c.id.removeprefix("proof/").rpartition("/")
                verdict_rows.append([variant, arch, "not checked" if c.outcome == "skip"
                                     else c.outcome, c.detail or "-"])
    proof = [f"Per patch, `nox -s verify_sm120 -- --stack {ev.stack}` on a CPU machine (no "
             f"GPU; `{verify_shown}`, made from this series and these wheels):", "",
             *_md_table(["patch", "evidence", "result"], patch_rows)]
    if verdict_rows:
        proof += ["", "SM120/SM121 compile proof (the series compiled with nvcc and the "
                  "cubins inspected kernel by kernel):", "",
                  *_md_table(["variant", "arch", "verdict", "reasons"], verdict_rows)]
    layer: list[str] = []
    for path, rec in ev.layer:
        judged = _judged(rec)
        passed = sum(c.outcome == "pass" for c in judged)
        layer.append(f"- SGLang's own fused-norm layer path under injected workspace faults "
                     f"(`{path.relative_to(ws.root).as_posix()}`): {passed}/{len(judged)} "
                     f"cases pass ({', '.join(c.id for c in judged)}), none hung"
                     + ("; ranks shared one GPU" if rec.machine.shared_gpu else ""))
    tests: list[str] = []
    env_rows: list[list[str]] = []
    for path, rec in ev.gpu_tests:
        against = [c.against for c in rec.cases if c.against]
        versus = ", ".join(f"{against.count(a)} {a}" for a in dict.fromkeys(against))
        tests.append(f"- {rec.machine.description} (`{path.relative_to(ws.root).as_posix()}`, "
                     f"`{rec.command}`): {_counts(rec)}"
                     + (f"; against the baseline: {versus}" if versus else ""))
        m = rec.machine
        for key, value in (("gpus", ", ".join(m.gpus)), ("capability", m.capability),
                           ("driver", m.driver), ("cuda", m.cuda), ("torch", m.torch),
                           ("python", m.python)):
            if value:
                env_rows.append([path.parent.name, key, str(value)])
    bench: list[str] = []
    timing = False
    for path, rec in ev.bench:
        if rec.machine.shared_gpu:
            what = ("not timing evidence: its ranks shared a GPU, so the latencies measure "
                    "the sharing, not the kernels; it shows the fused path runs")
        else:
            timing = True
            what = "timing evidence: one rank per GPU"
        rows = [[c.id, c.outcome, c.detail] for c in rec.cases]
        bench += [f"From `{path.relative_to(ws.root).as_posix()}` ({what}):", "",
                  *_md_table(["case", "outcome", "detail"], rows), ""]
    if not timing:
        bench += [f"Timing evidence: none of this build (a bench with one rank per GPU; "
                  f"on a machine with 2 or more GPUs run "
                  f"`{rerun_command('bench', ev.stack)}`)."
                  + "".join(f" Not used: {h}." for h in ev.bench_history)]
    wheel_rows = [[w.wheel, f"`{w.sha256}`",
                   f"{sum(r.passed for r in w.artifact_check)}/{len(w.artifact_check)}"]
                  for w in ev.manifest_wheels]
    return {
        "proof": proof,
        "tests": [*tests, *layer],
        "bench": bench,
        "env": _md_table(["record", "key", "value"], env_rows) if env_rows else ["-"],
        "wheels": ["Wheels built by the fork toolkit from these commits "
                   f"(`{ev.manifest_name}`):", "",
                   *_md_table(["wheel", "sha256", "artifact check"], wheel_rows)],
    }
