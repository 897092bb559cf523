"""The committed SM12x evidence of each stack is of its series as it is now.

CI does not re-run the evidence on every commit (the default stack's compile proof is
about 20 minutes of nvcc on two cores; it runs in the ``proof`` workflow job and by
``nox -s verify_sm120``).  What CI does check: each stack with patches has its own
``reports/sm120/<stack>/verify.json``, made from that stack's current series by the same
provenance rule ``upstream_pr`` applies, and it passed.  A change to any patch without
new evidence fails here, naming the command that makes it current.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sm120fork.declare import Stack
from sm120fork.patch.series import load_series
from sm120fork.upstream.evidence import current_builds, provenance_problem
from sm120fork.verify.proof.patches import claims
from sm120fork.workspace import Workspace

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


def _shown(stack: str) -> str:
    return f"reports/sm120/{stack}/verify.json"


def _check(stack: Stack, doc: dict[str, object]) -> tuple[str, str]:
    return provenance_problem(_shown(stack.name), doc, stack, "verify",
                              current_builds(WS, stack, []))


def test_every_stack_with_patches_is_checked() -> None:
    assert {"sglang-0.5.10", "sglang-0.5.23"} <= set(PATCHED)


@pytest.mark.parametrize("name", PATCHED)
def test_the_committed_evidence_is_of_the_current_series_and_passed(name: str) -> None:
    doc = json.loads((REPO / _shown(name)).read_text())
    stack = WS.stack(name)
    assert doc["stack"] == name
    assert _check(stack, doc) == ("", "")
    assert doc["passed"] is True
    assert doc["patches"]
    assert [p["patch"] for p in doc["patches"] if not p["passed"]] == []
    if doc.get("proof"):
        full = [v for v in doc["verdicts"] if v["variant"] == "full series"]
        assert {v["arch"] for v in full} >= {"sm_90a", "sm_120f", "sm_120a", "sm_121a"}
        assert [v["arch"] for v in full if v["status"] != "pass"] == []


def test_the_default_stack_evidence_has_the_compile_proof() -> None:
    doc = json.loads((REPO / _shown("sglang-0.5.10")).read_text())
    assert doc["proof"]


def test_a_proof_of_an_older_series_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")  # the hint a nox user is given
    doc = json.loads((REPO / _shown("sglang-0.5.10")).read_text())
    made = doc["made_from"][0]
    made["series_digest"] = "0" * 64
    reason, message = _check(WS.stack("sglang-0.5.10"), doc)
    assert reason == "stale"
    assert f"another {made['project']} series" in message
    assert "nox -s verify_sm120 -- --stack sglang-0.5.10" in message


def test_evidence_of_another_stack_is_refused() -> None:
    doc = json.loads((REPO / _shown("sglang-0.5.10")).read_text())
    reason, _ = _check(WS.stack("sglang-0.5.23"), doc)
    assert reason == "other stack"
