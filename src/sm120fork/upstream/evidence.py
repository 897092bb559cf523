"""The evidence an upstream PR carries, gathered and checked: refused when missing or failing.

The wheel manifest, the SM120 compile proof (``reports/sm120/<stack>/verify.json``), the GPU A/B
results (``reports/gpu/*/test-ab.json``) and the bench tables, each with its sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120fork.declare import Project, Stack
from sm120fork.errors import MaintenanceError
from sm120fork.patch.series import load_series
from sm120fork.util.files import wheel_record_sha256
from sm120fork.util.hint import command
from sm120fork.util.markdown import markdown_table as _md_table
from sm120fork.workspace import Workspace

#: Variants of the compile proof and GPU tests that are the unpatched baseline.
#: Variants the proof shows failing on purpose (upstream, and the incomplete "two-line fix").
BASELINE_VARIANTS = ("unpatched", "F1 only", "upstream", "baseline")


@dataclass(frozen=True, kw_only=True)
class Evidence:
    manifest_entry: dict[str, Any]
    manifest_wheels: list[dict[str, Any]]
    verify: dict[str, Any]
    verify_path: Path
    gpu_tests: list[tuple[Path, dict[str, Any]]]
    #: SGLang's layer path on a GPU (``gpu sglang-layer``: the fault matrix), of today's series.
    layer: list[tuple[Path, dict[str, Any]]]
    #: bench.md, its text and its bench.json, of today's series.
    bench: list[tuple[Path, str, dict[str, Any]]]
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256
    manifest_name: str = "wheels/<stack>/manifest.json"
    stack: str = ""
    project: str = ""
    #: The patches of the PR (file names; None: every patch of the project).
    patches: tuple[str, ...] | None = None
    #: Why each bench report in reports/gpu/ is not of today's series.
    bench_history: tuple[str, ...] = ()



def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def rerun_command(kind: str, stack: str) -> str:
    """The one command that re-makes ``kind`` of evidence of ``stack`` (the GPU kinds on a
    machine with the GPUs, after the stack's build: test and bench write
    ``reports/gpu/<gpu>-<count>x/``, the SGLang layer path ``reports/gpu/<stack>-layer/``)."""
    if kind == "verify":
        return command("verify-sm120", "--stack", stack)
    if kind == "test":
        return command("gpu test", "--stack", stack, "--quick", "--world-sizes", "2")
    if kind == "layer":
        return command("gpu sglang-layer", "--stack", stack, "--out",
                       f"reports/gpu/{stack}-layer")
    return command("gpu bench", "--stack", stack, "--quick", "--world-size", "2")


def _without_rerun(why: str, rerun: str) -> str:
    """``why`` without its re-run hint: a list of stale reports names the command once."""
    return why.replace(f"; re-run: {rerun}", "").replace(f" re-run: {rerun}", "").replace(
        f" (re-run: {rerun})", "")


def current_builds(ws: Workspace, stack: Stack, wheels: list[dict[str, Any]]
                   ) -> dict[str, tuple[str, frozenset[str]]]:
    """project -> (series digest now, sha256 of each of its published wheels).

    A project of several wheels (SGLang 0.5.23: one per Python and platform) is tested as
    one of them: any published one is of today's build.
    """
    sha: dict[str, set[str]] = {}
    for w in wheels:
        if w.get("sha256"):
            sha.setdefault(str(w.get("project")), set()).add(str(w["sha256"]))
    return {p.key: (load_series(ws.series_dir(p)).digest, frozenset(sha.get(p.key, ())))
            for p in stack.projects}


def published_records(folder: Path, wheels: list[dict[str, Any]]) -> dict[str, str]:
    """wheel file name -> sha256 of its RECORD, for each published wheel in ``folder``."""
    records: dict[str, str] = {}
    for w in wheels:
        path = folder / str(w.get("wheel"))
        if path.is_file() and (digest := wheel_record_sha256(path)):
            records[str(w.get("wheel"))] = digest
    return records


def provenance_problem(shown: str, doc: dict[str, Any], stack: Stack, kind: str,
                       current: dict[str, tuple[str, frozenset[str]]],
                       require: str | None = None,
                       records: dict[str, str] | None = None) -> tuple[str, str]:
    """("", "") when ``doc`` was made from this stack's current series and wheels
    (and, with ``require``, from that project's among them).

    A GPU run of a published wheel that travelled as its tree (zipped again: other bytes; or
    imported as a folder: no bytes of its own) counts when its RECORD digest is that of the
    wheel of that name published here (``records``).

    Otherwise (reason, message), reason one of ``absent`` (it records nothing to check),
    ``other stack`` and ``stale`` (another series or wheel of this stack).
    """
    rerun = rerun_command(kind, stack.name)
    if "stack" not in doc or "made_from" not in doc:
        return "absent", (f"{shown} does not record the stack, series and wheel it was made "
                          f"from (made by an older toolkit? re-run: {rerun})")
    if doc["stack"] != stack.name:
        return "other stack", f"{shown} was made from stack {doc['stack']!r}, not {stack.name!r}"
    made = [m for m in doc["made_from"] if isinstance(m, dict)]
    if not made:
        return "absent", (f"{shown} names no wheel of stack {stack.name} it was made from "
                          f"(re-run: {rerun})")
    if require and require not in {m.get("project") for m in made}:
        return "stale", f"{shown} was not made from {stack.name}'s {require} (re-run: {rerun})"
    for m in made:
        project = str(m.get("project"))
        if project not in current:
            return "stale", f"{shown} was made from project {project!r}, not in {stack.name}"
        digest, shas = current[project]
        if m.get("series_digest") != digest:
            return "stale", (f"{shown} was made from another {project} series (digest "
                             f"{str(m.get('series_digest'))[:12]}, now {digest[:12]}; "
                             f"re-run: {rerun})")
        if shas and m.get("wheel_sha256") not in shas:
            return "stale", (f"{shown} was made from another {project} wheel (sha256 "
                             f"{str(m.get('wheel_sha256'))[:12]}, published "
                             f"{', '.join(sorted(x[:12] for x in shas))}; re-run: {rerun})")
        tested = m.get("tested_sha256")
        if (tested or "record_sha256" in m) and tested != m.get("wheel_sha256"):
            published = (records or {}).get(str(m.get("wheel")))
            if not published:
                return "stale", (f"{shown} tested a copy of {m.get('wheel')} (sha256 "
                                 f"{str(tested)[:12] if tested else 'none: a folder'}) whose "
                                 "RECORD cannot be compared: the "
                                 f"published wheel is not here (run: "
                                 f"{command('build', '--stack', stack.name)})")
            if m.get("record_sha256") != published:
                return "stale", (f"{shown} tested another {project} wheel than the one "
                                 f"published (RECORD {str(m.get('record_sha256'))[:12]}, "
                                 f"published {published[:12]}; re-run: {rerun})")
    return "", ""


def _verify_problems(shown: str, verify: dict[str, Any], project: Project, stack: str,
                     patches: Sequence[str] | None = None) -> list[str]:
    """What verify.json (of this stack, today's series) says against ``project``'s PR.

    Each of the project's patches must have passed its checks there; the compile proof's
    verdicts are required only where a patch names the proof as its evidence (a stack
    whose FlashInfer needs no patch, or whose patches claim GPU runs, has none).
    """
    rerun = rerun_command("verify", stack)
    mine = [p for p in verify.get("patches", []) if p.get("project") == project.key
            and (patches is None or p.get("patch") in patches)]
    failing = [f"{v.get('variant')}/{v.get('arch')}" for v in verify.get("verdicts", [])
               if v.get("variant") not in BASELINE_VARIANTS and v.get("status") == "fail"]
    if failing:
        return [f"the SM120 compile proof fails for {', '.join(failing)}"]
    if not mine:
        return [f"{shown} has no check of a {project.key} patch (re-run: {rerun})"]
    if bad := [str(p.get("patch")) for p in mine if not p.get("passed")]:
        return [f"{shown} says {', '.join(bad)} failed its checks"]
    if any("compile proof" in str(p.get("evidence")) for p in mine) and \
            not verify.get("verdicts"):
        return [f"{shown} names the compile proof but holds no verdicts (re-run: {rerun})"]
    return []


def _layer_runs(ws: Workspace, stack: Stack, project: Project,
                current: dict[str, tuple[str, frozenset[str]]], records: dict[str, str],
                files: dict[str, str], problems: list[str]) -> list[tuple[Path, dict[str, Any]]]:
    """SGLang's layer path on a GPU (the fault matrix) made from this stack's ``project``."""
    found: list[tuple[Path, dict[str, Any]]] = []
    history: list[str] = []
    rerun = rerun_command("layer", stack.name)
    for path in sorted((ws.reports_dir / "gpu").glob("**/report.json")):
        doc = _load_json(path) or {}
        if "cases" not in doc:
            continue
        rel = path.relative_to(ws.root).as_posix()
        _, why = provenance_problem(rel, doc, stack, "layer", current, require=project.key,
                                    records=records)
        if why:
            history.append(why)
            continue
        files[rel] = _sha256(path)
        cases = doc.get("cases", [])
        failed = [str(c.get("case")) + (" (hung)" if c.get("hung") else "")
                  for c in cases if not c.get("passed")]
        left = [c for c in doc.get("planned", []) if c not in {x.get("case") for x in cases}]
        if failed:
            problems.append(f"SGLang's layer path failed in {rel}: {', '.join(failed)}")
        elif left or not doc.get("finished") or not cases:
            problems.append(f"{rel} did not finish: {', '.join(left) or 'cases'} not run "
                            f"(re-run: {rerun})")
        found.append((path, doc))
    if not found:
        problems.append(f"no GPU run of SGLang's layer path (the fault matrix) of stack "
                        f"{stack.name}'s current series in reports/gpu/**/report.json (on a "
                        f"machine with a GPU, run: {rerun})"
                        + "".join(f"; {_without_rerun(h, rerun)}" for h in history[:3])
                        + (f"; and {len(history) - 3} older reports" if len(history) > 3
                           else ""))
    return found


def collect_evidence(ws: Workspace, stack: Stack, project: Project, series_digest: str,
                     wheels_dir: Path | None = None,
                     patches: Sequence[str] | None = None) -> Evidence:
    """Gather the evidence, or refuse naming everything missing or failing.

    Evidence is of today's series: a GPU report of an older series, another stack or no
    recorded provenance is history, not evidence; it is named (with the command that
    re-makes it) only when no report of today's series is left.
    """
    problems: list[str] = []
    files: dict[str, str] = {}
    manifest_path = (wheels_dir or ws.stack_wheels(stack.name)) / "manifest.json"
    shown = os.path.relpath(manifest_path, ws.root)
    manifest = _load_json(manifest_path)
    entry: dict[str, Any] = {}
    wheels: list[dict[str, Any]] = []
    if manifest is None:
        problems.append(f"no {shown} (run: "
                        + command("build", "--stack", stack.name,
                                  *(["--out", os.path.relpath(manifest_path.parent, ws.root)]
                                    if wheels_dir else [])) + ")")
    elif manifest.get("stack") != stack.name:
        problems.append(f"{shown} is for stack {manifest.get('stack')!r}, not "
                        f"{stack.name!r} (build this stack, or pass --wheels)")
    else:
        wheels = list(manifest.get("wheels", []))
        entry = next((w for w in wheels if w.get("project") == project.key), {})
        if not entry:
            problems.append(f"{shown} has no {project.key} wheel")
        elif entry.get("series_digest") != series_digest:
            problems.append(f"the {project.key} wheel was built from another series "
                            f"(run: {command('build', '--stack', stack.name)})")
        elif not all(r.get("passed") for r in entry.get("artifact_check", [])):
            problems.append(f"the {project.key} wheel failed its artifact check")
        files[shown] = _sha256(manifest_path)
    current = current_builds(ws, stack, wheels)
    records = published_records(manifest_path.parent, wheels)
    verify_path = ws.verify_reports(stack.name) / "verify.json"
    verify_shown = verify_path.relative_to(ws.root).as_posix()
    verify = _load_json(verify_path) or {}
    _, why = provenance_problem(verify_shown, verify, stack, "verify", current,
                                require=project.key)
    if not verify:
        problems.append(f"no SM120 compile proof of stack {stack.name} "
                        f"{ws.verify_reports(stack.name).relative_to(ws.root)}/verify.json "
                        f"(run: {rerun_command('verify', stack.name)})")
    elif why:
        problems.append(why)
    else:
        files[verify_shown] = _sha256(verify_path)
        problems += _verify_problems(verify_shown, verify, project, stack.name, patches)
    gpu_tests: list[tuple[Path, dict[str, Any]]] = []
    history: list[str] = []  # GPU reports that are not of today's series
    for path in sorted((ws.reports_dir / "gpu").glob("*/test-ab.json")):
        doc = _load_json(path)
        rel = str(path.relative_to(ws.root))
        if doc is None:
            problems.append(f"{rel} is not valid JSON")
            continue
        _, why = provenance_problem(rel, doc, stack, "test", current, records=records)
        if why:
            history.append(why)
            continue
        files[rel] = _sha256(path)
        primary = str(doc.get("primary", "patched"))
        failed = [r.get("key") for r in doc.get("results", {}).get(primary, [])
                  if r.get("status") == "fail"]
        ran = [r for r in doc.get("results", {}).get(primary, [])
               if r.get("status") in ("pass", "fail")]
        if failed:
            problems.append(f"GPU tests failed in {rel}: "
                            f"{len(failed)} case(s), e.g. {failed[0]} (once fixed, re-run: "
                            f"{rerun_command('test', stack.name)})")
        elif not ran:
            problems.append(f"{rel} ran no case of {primary} (re-run: "
                            f"{rerun_command('test', stack.name)})")
        elif doc.get("finished") is False:
            problems.append(f"{rel} did not finish: cases were left out (re-run: "
                            f"{rerun_command('test', stack.name)})")
        gpu_tests.append((path, doc))
    layer: list[tuple[Path, dict[str, Any]]] = []
    if project.normalized_name == "sglang":
        layer = _layer_runs(ws, stack, project, current, records, files, problems)
    if not gpu_tests:
        rerun = rerun_command("test", stack.name)
        problems.append(f"no GPU test results of stack {stack.name}'s current series in "
                        f"reports/gpu/*/test-ab.json (on a machine with GPUs, run: {rerun})"
                        + "".join(f"; {_without_rerun(h, rerun)}" for h in history))
    bench: list[tuple[Path, str, dict[str, Any]]] = []
    bench_history: list[str] = []
    for path in sorted((ws.reports_dir / "gpu").glob("*/bench.md")):
        doc = _load_json(path.with_suffix(".json")) or {}
        _, why = provenance_problem(str(path.with_suffix(".json").relative_to(ws.root)),
                                    doc, stack, "bench", current, records=records)
        if why:
            bench_history.append(why)
            continue
        bench.append((path, path.read_text(encoding="utf-8"), doc))
        files[str(path.relative_to(ws.root))] = _sha256(path)
    if problems:
        raise MaintenanceError(
            "refusing to prepare an upstream PR: " + "; ".join(problems),
            where=f"{stack.name}/{project.key}",
            fix="produce the missing evidence (or fix what failed) and run upstream_pr again")
    return Evidence(manifest_entry=entry, manifest_wheels=wheels, verify=verify,
                    verify_path=verify_path, gpu_tests=gpu_tests, layer=layer, bench=bench,
                    files=files, project=project.key,
                    patches=tuple(patches) if patches is not None else None,
                    manifest_name=shown, stack=stack.name, bench_history=tuple(bench_history))


def evidence_sections(ws: Workspace, ev: Evidence) -> dict[str, list[str]]:
    verdict_rows = [[str(v.get("variant")), str(v.get("arch")), str(v.get("status")),
                     "; ".join(map(str, v.get("reasons", [])))[:200] or "-"]
                    for v in ev.verify.get("verdicts", [])]
    verify_shown = ev.verify_path.relative_to(ws.root).as_posix()
    mine = [p for p in ev.verify.get("patches", []) if p.get("project") == ev.project
            and (ev.patches is None or p.get("patch") in ev.patches)]
    patch_rows = [[str(p.get("patch")), str(p.get("evidence")),
                   "pass" if p.get("passed") else "fail"] for p in mine]
    if not any("compile proof" in str(p.get("evidence")) for p in mine):
        verdict_rows = []  # no patch of this PR stands on the proof
    proof = [f"Per patch, `nox -s verify_sm120 -- --stack {ev.stack}` on a CPU machine (no "
             f"GPU; `{verify_shown}`, made from this series and these wheels):", "",
             *_md_table(["patch", "evidence", "result"], patch_rows)]
    if verdict_rows:
        proof += ["", "SM120/SM121 compile proof (the series compiled with nvcc and the "
                  "cubins inspected kernel by kernel):", "",
                  *_md_table(["variant", "arch", "verdict", "reasons"], verdict_rows)]
    layer: list[str] = []
    for path, doc in ev.layer:
        cases = doc.get("cases", [])
        passed = sum(bool(c.get("passed")) for c in cases)
        layer.append(f"- SGLang's own fused-norm layer path under injected workspace faults "
                     f"(`{path.relative_to(ws.root)}`): {passed}/{len(cases)} cases pass "
                     f"({', '.join(str(c.get('case')) for c in cases)}), none hung"
                     + ("; ranks shared one GPU" if doc.get("shared", True) else ""))
    tests: list[str] = []
    env_rows: list[list[str]] = []
    def counts(records: list[dict[str, Any]]) -> str:
        statuses: dict[str, int] = {}
        for r in records:
            statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
        return ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "no cases"

    for path, doc in ev.gpu_tests:
        primary = str(doc.get("primary", "patched"))
        results = doc.get("results", {})
        run = f", `{doc['command']}`" if doc.get("command") else ""
        baseline = doc.get("baseline")
        tests.append(f"- {doc.get('title', path.parent.name)} (`{path.relative_to(ws.root)}`"
                     f"{run}): {primary}: {counts(results.get(primary, []))}"
                     + (f"; baseline {baseline}: {counts(results.get(baseline, []))}"
                        if baseline else ""))
        for k, v in sorted(doc.get("environment", {}).items()):
            if k == "wheels_manifest":  # the wheels table below says it, readably
                continue
            env_rows.append([path.parent.name, str(k), json.dumps(v) if not isinstance(
                v, str) else v])
    bench: list[str] = []
    timing = False
    for path, text, doc in ev.bench:
        gpus = doc.get("environment", {}).get("gpu_count")
        ranks = doc.get("world_size")
        if doc.get("shared"):
            what = (f"not timing evidence: its {ranks or 'several'} ranks shared "
                    f"{gpus or 'one'} GPU, so the latencies measure the sharing, not the "
                    "kernels; it shows the fused path runs")
        else:
            timing = True
            what = (f"timing evidence: {ranks} ranks, one per GPU"
                    + (f", {gpus} GPU(s)" if gpus else ""))
        bench += [f"From `{path.relative_to(ws.root)}` ({what}):", "", text.strip(), ""]
    if not timing:
        bench += [f"Timing evidence: none of this series (a bench with one rank per GPU; "
                  f"on a machine with 2 or more GPUs run "
                  f"`{rerun_command('bench', ev.stack)}`)."
                  + "".join(f" Not used: {h}." for h in ev.bench_history)]
    wheel_rows = [[str(w.get("wheel")), f"`{w.get('sha256')}`",
                   f"{sum(bool(r.get('passed')) for r in w.get('artifact_check', []))}/"
                   f"{len(w.get('artifact_check', []))}"] for w in ev.manifest_wheels]
    return {
        "proof": proof,
        "tests": [*tests, *layer],
        "bench": bench,
        "env": _md_table(["report", "key", "value"], env_rows) if env_rows else ["-"],
        "wheels": ["Wheels built by the fork toolkit from these commits "
                   f"(`{ev.manifest_name}`):", "",
                   *_md_table(["wheel", "sha256", "artifact check"], wheel_rows)],
    }


