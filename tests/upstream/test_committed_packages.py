"""The committed upstream packages (reports/upstream/<stack>-<project>/) are of today's series.

A package is what ``nox -s upstream_pr -- <stack> <project> --write`` wrote: the branch's
patches of the series as it is now, and the evidence files it cited with their sha256.
A patch changed since, or a cited report made again or gone, makes the package stale:
this fails, naming the command that writes it again. Each package cites its own stack's
evidence only (issue 21.1: no stack borrows another's verify report).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sm120fork.patch.series import load_series
from sm120fork.upstream.pr import REPRODUCER
from sm120fork.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]
WS = Workspace(REPO)
PACKAGES = sorted(p.parent for p in (REPO / "reports" / "upstream").glob("*/evidence.json"))


def test_there_are_packages() -> None:
    assert PACKAGES


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_a_committed_package_is_of_todays_series_and_its_own_stacks_evidence(
        folder: Path) -> None:
    doc = json.loads((folder / "evidence.json").read_text())
    again = f"nox -s upstream_pr -- {doc['stack']} {doc['project']} --write"
    assert folder.name == f"{doc['stack']}-{doc['project']}"
    series = load_series(WS.series_dir(WS.stack(doc["stack"]).project(doc["project"])))
    now = {p.name: p.sha256 for p in series.patches if not p.applied_upstream}
    assert {p["name"]: p["sha256"] for p in doc["patches"]} == now, f"stale: {again}"
    for rel, sha in doc["evidence_files"].items():
        if rel.startswith("wheels/"):  # built, not committed: its sha256 is in the body
            continue
        assert rel.startswith((f"reports/sm120/{doc['stack']}/", "reports/gpu/")), rel
        path = REPO / rel
        assert path.is_file(), f"{rel} is gone: {again}"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, f"{rel} changed: {again}"
    text = "".join(p.read_text(encoding="utf-8") for p in folder.rglob("*")
                   if p.is_file() and REPRODUCER not in p.relative_to(folder).parts)
    assert "reports/sm120/verify.json" not in text  # the old single report: nobody's
