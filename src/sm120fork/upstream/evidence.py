"""The evidence an upstream PR carries, gathered and checked: refused when missing or failing.

The wheel manifest, the SM120 compile proof (``reports/sm120/<stack>/verify.json``), the GPU A/B
results (``reports/gpu/*/test-ab.json``) and the bench tables, each with its sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120fork.declare import Project, Stack
from sm120fork.errors import MaintenanceError
from sm120fork.patch.series import load_series
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
    bench: list[tuple[Path, str]]
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256
    manifest_name: str = "wheels/<stack>/manifest.json"



def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


#: What a re-run of each kind of evidence takes.
_RERUN = {"verify": "nox -s verify_sm120 -- --stack {stack}", "test": "nox -s gpu_test -- ...",
          "bench": "nox -s bench -- ..."}


def current_builds(ws: Workspace, stack: Stack, wheels: list[dict[str, Any]]
                   ) -> dict[str, tuple[str, str]]:
    """project -> (series digest now, sha256 of its published wheel or '')."""
    sha: dict[str, str] = {}
    for w in wheels:  # a project of several wheels is named by its first (verify.json too)
        sha.setdefault(str(w.get("project")), str(w.get("sha256") or ""))
    return {p.key: (load_series(ws.series_dir(p)).digest, sha.get(p.key, ""))
            for p in stack.projects}


def provenance_problem(shown: str, doc: dict[str, Any], stack: Stack, kind: str,
                       current: dict[str, tuple[str, str]],
                       require: str | None = None) -> tuple[str, str]:
    """("", "") when ``doc`` was made from this stack's current series and wheels
    (and, with ``require``, from that project's among them).

    Otherwise (reason, message), reason one of ``absent`` (it records nothing to check),
    ``other stack`` and ``stale`` (another series or wheel of this stack).
    """
    rerun = _RERUN[kind].format(stack=stack.name)
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
        digest, sha = current[project]
        if m.get("series_digest") != digest:
            return "stale", (f"{shown} was made from another {project} series (digest "
                             f"{str(m.get('series_digest'))[:12]}, now {digest[:12]}; "
                             f"re-run: {rerun})")
        if sha and m.get("wheel_sha256") != sha:
            return "stale", (f"{shown} was made from another {project} wheel (sha256 "
                             f"{str(m.get('wheel_sha256'))[:12]}, published {sha[:12]}; "
                             f"re-run: {rerun})")
    return "", ""


def collect_evidence(ws: Workspace, stack: Stack, project: Project, series_digest: str,
                     wheels_dir: Path | None = None) -> Evidence:
    """Gather the evidence, or refuse naming everything missing or failing."""
    problems: list[str] = []
    files: dict[str, str] = {}
    manifest_path = (wheels_dir or ws.stack_wheels(stack.name)) / "manifest.json"
    shown = os.path.relpath(manifest_path, ws.root)
    manifest = _load_json(manifest_path)
    entry: dict[str, Any] = {}
    wheels: list[dict[str, Any]] = []
    if manifest is None:
        problems.append(f"no {shown} (run: python -m sm120fork build --stack {stack.name}"
                        + (f" --out {os.path.relpath(manifest_path.parent, ws.root)})"
                           if wheels_dir else ")"))
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
                            "(rebuild after the last change)")
        elif not all(r.get("passed") for r in entry.get("artifact_check", [])):
            problems.append(f"the {project.key} wheel failed its artifact check")
        files[shown] = _sha256(manifest_path)
    current = current_builds(ws, stack, wheels)
    verify_path = ws.verify_reports(stack.name) / "verify.json"
    verify_shown = verify_path.relative_to(ws.root).as_posix()
    verify = _load_json(verify_path) or {}
    _, why = provenance_problem(verify_shown, verify, stack, "verify", current,
                                require=project.key)
    if not verify:
        problems.append(f"no SM120 compile proof {verify_shown} "
                        f"(run: nox -s verify_sm120 -- --stack {stack.name})")
    elif why:
        problems.append(why)
    else:
        files[str(verify_path.relative_to(ws.root))] = _sha256(verify_path)
        failing = [f"{v.get('variant')}/{v.get('arch')}" for v in verify.get("verdicts", [])
                   if v.get("variant") not in BASELINE_VARIANTS and v.get("status") == "fail"]
        if failing:
            problems.append(f"the SM120 compile proof fails for {', '.join(failing)}")
        elif verify.get("passed") is False:
            problems.append(f"{verify_shown} says a patch check failed")
        elif not verify.get("verdicts"):
            problems.append(f"{verify_shown} holds no verdicts")
    gpu_tests: list[tuple[Path, dict[str, Any]]] = []
    elsewhere: list[str] = []  # evidence of other stacks: not ours, not a refusal
    for path in sorted((ws.reports_dir / "gpu").glob("*/test-ab.json")):
        doc = _load_json(path)
        if doc is None:
            problems.append(f"{path.relative_to(ws.root)} is not valid JSON")
            continue
        reason, why = provenance_problem(str(path.relative_to(ws.root)), doc, stack, "test",
                                         current)
        if reason == "other stack":
            elsewhere.append(why)
            continue
        if why:
            problems.append(why)
            continue
        files[str(path.relative_to(ws.root))] = _sha256(path)
        primary = str(doc.get("primary", "patched"))
        failed = [r.get("key") for r in doc.get("results", {}).get(primary, [])
                  if r.get("status") == "fail"]
        if failed:
            problems.append(f"GPU tests failed in {path.relative_to(ws.root)}: "
                            f"{len(failed)} case(s), e.g. {failed[0]}")
        gpu_tests.append((path, doc))
    if not gpu_tests and not any("GPU tests" in p or "test-ab.json" in p for p in problems):
        problems.append("no GPU test results of this stack reports/gpu/*/test-ab.json "
                        "(run: nox -s gpu_test)" + "".join(f"; {e}" for e in elsewhere))
    bench: list[tuple[Path, str]] = []
    for path in sorted((ws.reports_dir / "gpu").glob("*/bench.md")):
        doc = _load_json(path.with_suffix(".json")) or {}
        reason, why = provenance_problem(str(path.with_suffix(".json").relative_to(ws.root)),
                                         doc, stack, "bench", current)
        if reason == "other stack":
            continue
        if why:
            problems.append(why)
            continue
        bench.append((path, path.read_text(encoding="utf-8")))
        files[str(path.relative_to(ws.root))] = _sha256(path)
    if problems:
        raise MaintenanceError(
            "refusing to prepare an upstream PR: " + "; ".join(problems),
            where=f"{stack.name}/{project.key}",
            fix="produce the missing evidence (or fix what failed) and run upstream_pr again")
    return Evidence(manifest_entry=entry, manifest_wheels=wheels, verify=verify,
                    verify_path=verify_path, gpu_tests=gpu_tests, bench=bench, files=files,
                    manifest_name=shown)




def evidence_sections(ws: Workspace, ev: Evidence) -> dict[str, list[str]]:
    verdict_rows = [[str(v.get("variant")), str(v.get("arch")), str(v.get("status")),
                     "; ".join(map(str, v.get("reasons", [])))[:200] or "-"]
                    for v in ev.verify.get("verdicts", [])]
    proof = ["SM120/SM121 compile proof (the series compiled with nvcc and the cubins "
             f"inspected kernel by kernel; `{ev.verify_path.relative_to(ws.root)}`):", "",
             *_md_table(["variant", "arch", "verdict", "reasons"], verdict_rows)]
    tests: list[str] = []
    env_rows: list[list[str]] = []
    for path, doc in ev.gpu_tests:
        primary = str(doc.get("primary", "patched"))
        statuses: dict[str, int] = {}
        for r in doc.get("results", {}).get(primary, []):
            statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
        counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "no cases"
        command = f", `{doc['command']}`" if doc.get("command") else ""
        tests.append(f"- {doc.get('title', path.parent.name)} (`{path.relative_to(ws.root)}`"
                     f"{command}): {primary}: {counts}"
                     + (f"; baseline {doc['baseline']}" if doc.get("baseline") else ""))
        for k, v in sorted(doc.get("environment", {}).items()):
            env_rows.append([path.parent.name, str(k), json.dumps(v) if not isinstance(
                v, str) else v])
    bench: list[str] = []
    for path, text in ev.bench:
        bench += [f"From `{path.relative_to(ws.root)}`:", "", text.strip(), ""]
    wheel_rows = [[str(w.get("wheel")), f"`{w.get('sha256')}`",
                   f"{sum(bool(r.get('passed')) for r in w.get('artifact_check', []))}/"
                   f"{len(w.get('artifact_check', []))}"] for w in ev.manifest_wheels]
    return {
        "proof": proof,
        "tests": tests,
        "bench": bench or ["Not measured: no reports/gpu/*/bench.md."],
        "env": _md_table(["report", "key", "value"], env_rows) if env_rows else ["-"],
        "wheels": ["Wheels built by the fork toolkit from these commits "
                   f"(`{ev.manifest_name}`):", "",
                   *_md_table(["wheel", "sha256", "artifact check"], wheel_rows)],
    }


