"""The committed SM12x proof is of the series as it is now.

CI does not re-run the compile proof on every commit (about 20 minutes of nvcc on two
cores; it runs in the ``proof`` workflow job and by ``nox -s verify_sm120``).  What CI
does check: ``reports/sm120/verify.json`` was made from the default stack's current
series, by the same provenance rule ``upstream_pr`` applies, and it passed.  A change to
any patch without a new proof fails here, naming the command that makes it current.
"""

from __future__ import annotations

import json
from pathlib import Path

from sm120fork.declare import load_stacks, select_stack
from sm120fork.upstream.evidence import current_builds, provenance_problem
from sm120fork.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
VERIFY = "reports/sm120/verify.json"


def _check(ws: Workspace, doc: dict[str, object]) -> tuple[str, str]:
    stack = select_stack(load_stacks(ws.forks_dir), None)
    return provenance_problem(VERIFY, doc, stack, "verify", current_builds(ws, stack, []))


def test_the_committed_proof_is_of_the_current_series_and_passed() -> None:
    doc = json.loads((REPO / VERIFY).read_text())
    assert _check(Workspace(REPO), doc) == ("", "")
    assert doc["passed"] is True
    assert doc["patches"]
    assert [p["patch"] for p in doc["patches"] if not p["passed"]] == []
    full = [v for v in doc["verdicts"] if v["variant"] == "full series"]
    assert {v["arch"] for v in full} >= {"sm_90a", "sm_120f", "sm_120a", "sm_121a"}
    assert [v["arch"] for v in full if v["status"] != "pass"] == []


def test_a_proof_of_an_older_series_is_refused() -> None:
    doc = json.loads((REPO / VERIFY).read_text())
    made = doc["made_from"][0]
    made["series_digest"] = "0" * 64
    reason, message = _check(Workspace(REPO), doc)
    assert reason == "stale"
    assert f"another {made['project']} series" in message
    assert "nox -s verify_sm120 -- --stack sglang-0.5.10" in message
