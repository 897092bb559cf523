"""The verify-sm120 record (``reports/<stack>/verify-sm120/``) and the full report in
``.forks/reports/sm120/<stack>/``."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from sm120fork import __version__
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
from sm120fork.util.markdown import markdown_table
from sm120fork.verify.proof.markdown import render_markdown
from sm120fork.verify.proof.patches import FULL
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


def to_json(result: VerifyResult, root: Path) -> dict[str, Any]:
    proof = result.proof.document(root) if result.proof else None
    document: dict[str, Any] = portable({
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
    return document


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


def compact(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with counts and a few names instead of per-kernel lists."""
    out = copy.deepcopy(document)
    for verdict in out["verdicts"]:
        for key in ("missing", "empty", "pdl_lost"):
            names = verdict[key]
            verdict[key] = {"count": len(names), "first": names[:NAMES_SHOWN]}
    for variant in (out["proof"] or {}).get("variants", []):
        for arch in variant["archs"]:
            for unit in arch["units"]:
                kernels = unit.pop("kernels")
                unit["kernel_count"] = len(kernels)
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
