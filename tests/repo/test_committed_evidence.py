"""The committed evidence of each stack stands for the stack as it is now.

CI does not re-run the evidence (the default stack's compile proof is about 20 minutes of
nvcc on two cores; the GPU runs need GPUs).  What it checks, in seconds and without
building: every committed record reads under the format's rules; each stack with patches
has its verify-sm120 and gpu-test records, passed, and made from its patches' changes as
they are now (``git patch-id --stable``: a reworded Description stales nothing); every
patch's ``Verified-By`` claim is backed by a passing record of its own stack; and no
record a claim needs is stale or missing.  A change to a patch's code without new
evidence fails here, naming per stale item the one command that re-makes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.patch.series import load_series
from sm120fork.record import published
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import (
    claim_record_path,
    claim_standings,
    claims,
    stack_evidence,
)
from sm120fork.verify.proof.patches import VERIFY_STACK_ENV, suite_node
from sm120fork.workspace import Workspace

from helpers_sglang import copy_stack
from helpers_ws import checkout_copy

REPO = Path(__file__).resolve().parents[2]
WS = Workspace(REPO)
#: Every stack whose series hold a patch: each has evidence of its own.
PATCHED = sorted(s.name for s in WS.stacks().values()
                 if any(load_series(WS.series_dir(p)).patches for p in s.projects))


def test_every_patch_of_every_stack_claims_its_evidence() -> None:
    """Each patch names what backs it (``Verified-By``, patches/README.md): a new patch
    without a claim fails here, naming it."""
    unclaimed = {f"{project.series}/{patch.name}" for stack in WS.stacks().values()
                 for project in stack.projects
                 for patch in load_series(WS.series_dir(project)).patches if not claims(patch)}
    assert not unclaimed, f"no Verified-By line (patches/README.md): {sorted(unclaimed)}"


def test_every_committed_record_reads_and_lies_in_its_folder() -> None:
    records = published(WS.reports_dir)
    assert {rec.stack for _, rec in records} >= set(PATCHED)


def test_every_stack_with_patches_is_checked() -> None:
    assert {"sglang-0.5.10", "sglang-0.5.23"} <= set(PATCHED)


@pytest.mark.parametrize("name", PATCHED)
def test_the_committed_records_are_of_the_stack_as_it_is_and_passed(name: str) -> None:
    stack = WS.stack(name)
    # The local wheels (a developer's build) are not what CI has: judge the patches.
    today = ResolvedStack.of(WS, stack, wheels_dir=REPO / ".no-such-wheels")
    standings = {s.kind: s for s in stack_evidence(today)
                 if s.kind in ("verify-sm120", "gpu-test", "sglang-layer")}
    stale = [s.message() for s in standings.values() if not s.current]
    assert not stale, "\n".join(stale)
    assert {k: s.verdict for k, s in standings.items()} == dict.fromkeys(standings, "pass")


def _today(name: str) -> ResolvedStack:
    # The local wheels (a developer's build) are not what CI has: judge the patches.
    return ResolvedStack.of(WS, WS.stack(name), wheels_dir=REPO / ".no-such-wheels")


@pytest.mark.parametrize("name", PATCHED)
def test_every_claim_is_backed_by_a_passing_record_of_its_stack(name: str) -> None:
    today = _today(name)
    stale = [s.message() for s in claim_standings(today) if not s.current]
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize("name", PATCHED)
def test_no_record_a_claim_needs_is_stale_or_missing(name: str) -> None:
    """A claim is judged on its patch's change alone; the record that backs it must also
    be of the stack as it is (every patch it tested unchanged): a record made before
    another patch changed is stale here even where the claim still stands."""
    today = _today(name)
    records = {s.name: s for s in stack_evidence(today)}
    wanted = {claim_record_path(c.kind, c.check, name)[0]
              for series in today.series.values() for p in series.patches for c in claims(p)}
    bad = [records[w].message() if w in records else f"{w}: missing" for w in sorted(wanted)
           if w not in records or not records[w].current]
    assert not bad, "\n".join(bad)


def test_no_upstream_package_or_patch_copy_is_committed() -> None:
    """An upstream PR's package (patches, body, a reproducer run with this checkout's
    harness) is made on demand by upstream_pr from patches/; what stays committed of it is
    its record under reports/<stack>/upstream-pr/<pr>/ (issue 32)."""
    copies = sorted(p.relative_to(REPO).as_posix() for p in WS.reports_dir.rglob("*")
                    if p.is_file() and (p.suffix == ".patch"
                                        or p.relative_to(WS.reports_dir).parts[0] == "upstream"))
    assert not copies, f"not evidence but copies (upstream_pr makes them): {copies}"


_DUMP_PLUGIN = """\
import json, os

def pytest_collection_finish(session):
    with open(os.environ["RUNS_STACK_DUMP"], "w") as out:
        json.dump({item.nodeid: [v for k, v in item.user_properties if k == "runs_stack"]
                   for item in session.items}, out)
"""


@pytest.mark.parametrize("name", PATCHED)
def test_a_renamed_copy_of_a_stack_resolves_every_claim_to_its_own_checks(
        tmp_path: Path, name: str) -> None:
    """A stack under another name (its toml and patch folders, nothing else changed but
    that one stack is the default; the original's records beside it): every claim names
    the copy's record, none is backed by the original's, and each ``cpu:`` claim's test,
    collected as verify-sm120 runs it for the copy, says it runs the copy's build (verify
    counts it; issue 41)."""
    shutil.copytree(REPO / "reports", checkout_copy(tmp_path, sdists=False) / "reports")
    root = tmp_path / "toolkit"
    copy_stack(root, name, "stack-copy", keep_wheels=1)
    toml = root / "forks" / "stack-copy.toml"
    toml.write_text(toml.read_text().replace("default = true", "default = false"))
    ws = Workspace(root)
    stack = ws.stack("stack-copy")
    standings = claim_standings(ResolvedStack.of(ws, stack))
    assert standings
    assert {s.state for s in standings} == {"missing"}
    assert all(s.reasons[0].startswith("reports/stack-copy/") for s in standings)
    nodes = sorted({suite_node(REPO, c.check) for p in stack.projects
                    for s in load_series(ws.series_dir(p)).patches
                    for c in claims(s) if c.kind == "cpu"})
    assert nodes
    (tmp_path / "dump_runs_stack.py").write_text(_DUMP_PLUGIN)
    dump = tmp_path / "runs_stack.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "dump_runs_stack", *nodes], cwd=REPO, check=True, capture_output=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")]),
             VERIFY_STACK_ENV: "stack-copy", "RUNS_STACK_DUMP": str(dump)})
    assert json.loads(dump.read_text()) == {node: ["stack-copy"] for node in nodes}
