"""What crosses the layer harness's process edge reads back as what was sent: the request
on the rank's command line, the observation and the error on the wire."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from sm120fork.gpu.layer.rank import RAISED, RESULT, RankRequest
from sm120fork.gpu.layer.run import render
from sm120fork.layouts import CaseOutcome, Ended, Observation, Raised, Step
from sm120fork.util import typed, wire


def _over_the_wire(tag: str, value: Observation | Raised) -> object:
    out = io.StringIO()
    wire.say(tag, dataclasses.asdict(value), stream=out)
    return wire.last(out.getvalue(), tag)


def test_the_request_the_observation_and_the_error_round_trip() -> None:
    request = RankRequest(rank=1, world_size=2, case="policy-graph", layout="layer_boundary",
                          init_method="tcp://127.0.0.1:1", device="cpu", tokens=(8, 9),
                          fused_call_agreement_timeout_s=3.0, policy_path="/p.json")
    argv = json.dumps(dataclasses.asdict(request))
    assert typed.read(RankRequest, json.loads(argv), "argv") == request
    observation = Observation(
        rank=1, layout="layer_boundary", warnings=("one",),
        steps=(Step(tokens=8, path="fused", route="fused", norm_error=1e-3,
                    residual_error=2e-3, correct=True, graph=True),
               Step(tokens=9, path="sglang_dispatch", norm_error=0.0, residual_error=0.0,
                    correct=False, skipped="not captured")),
        fake_buffers_alive=3, gate_after=True, pcie_ipc_log=("built",))
    assert typed.read(Observation, _over_the_wire(RESULT, observation), "w") == observation
    raised = Raised(rank=0, error="RuntimeError: x", after_fused_call_error_s=3.1,
                    agreement_timeout_s=3.0)
    assert typed.read(Raised, _over_the_wire(RAISED, raised), "w") == raised


def test_a_malformed_observation_is_refused_naming_its_key() -> None:
    with pytest.raises(typed.MalformedError, match=r"rank 0: RESULT: steps\[0\].correct"):
        typed.read(Observation, {"rank": 0, "layout": "x", "steps": [
            {"tokens": 1, "path": "fused", "norm_error": 0.0, "residual_error": 0.0}]},
            "rank 0: RESULT")


def test_the_report_json_of_a_case_keeps_every_rank_and_exit() -> None:
    outcome = CaseOutcome(
        case="fused", passed=True, hung=False, problems=[], seconds=2.0, tails=[],
        ranks=[Observation(rank=0, layout="communicator", steps=(
            Step(tokens=1, path="fused", norm_error=0.0, residual_error=0.0, correct=True,
                 gate=True),))],
        exits=[Ended(rank=0, exit=0, stopped_by_harness=False, ended_after_ready_s=1.0)])
    doc = json.loads(json.dumps(dataclasses.asdict(outcome)))
    assert doc["ranks"][0]["steps"][0] == {
        "tokens": 1, "path": "fused", "norm_error": 0.0, "residual_error": 0.0,
        "correct": True, "gate": True, "route": None, "graph": False, "skipped": None}
    assert doc["exits"][0]["raised"] is None
    assert "| fused | PASS | 0 | - | fused | 0.00e+00 / 0.00e+00 | 0 | off | 2.0 |" in render(
        [outcome], title="t", notes=[])
