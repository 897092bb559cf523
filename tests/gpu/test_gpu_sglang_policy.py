"""The layer harness's policy cases (issue 33 item 3), judged on the CPU.

A version 2 policy that switches methods at token boundaries among the methods an H200
runs is in force in every rank; at token counts on both sides of each boundary the route
that ran must be the one the decision code names for that process, and the output the
float32 reference's.  These tests judge the harness's planning and verdicts with made-up
rank reports (the ranks themselves run in tests/gpu/test_fail_closed.py's neighbours).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from helpers_manifest import entry, write_manifest
from sm120fork.gpu.core import records
from sm120fork.gpu.core.documents import Provenance
from sm120fork.gpu.decision import Process, decide
from sm120fork.gpu.layer import run as layer_run
from sm120fork.gpu.policy import validate
from sm120fork.layouts import CaseOutcome, Observation, Step

ROUTES = {1: "fused", 8: "fused", 9: "pcie_ipc", 32: "pcie_ipc", 33: "sglang_dispatch",
          64: "sglang_dispatch", 65: "fused", 128: "fused", 129: "sglang_dispatch"}


def test_the_policy_switches_h200_methods_at_token_boundaries() -> None:
    doc = layer_run.policy_document(2)
    assert validate(json.loads(json.dumps(doc)), "x")["for_use"] is True
    methods = [r["method"] for r in doc["tp"]["2"]["ranges"]]
    assert set(methods) == {"fused_auto", "pcie_ipc_rmsnorm", "nccl_rmsnorm"}
    assert layer_run.policy_tokens(doc, 2) == sorted(ROUTES)
    for capturing in (False, True):
        assert layer_run.expected_routes(doc, 2, sorted(ROUTES),
                                            capturing=capturing) == ROUTES
    # the judge asks the one decision code, for the process the ranks are (SM12x, bf16)
    decision = decide(doc, Process(world_size=2, dtype="bf16", gpu_major=12))
    assert decision.by_policy
    assert [decision.route_for(t) for t in sorted(ROUTES)] == list(ROUTES.values())


def _rank(rank: int, routes: dict[int, str], *, wrong: tuple[int, ...] = (),
          skipped: tuple[int, ...] = ()) -> Observation:
    steps = tuple(Step(tokens=tokens, route=route, path=route, correct=tokens not in wrong,
                       norm_error=1e-3, residual_error=1e-3,
                       skipped="not captured" if tokens in skipped else None)
                  for tokens, route in routes.items())
    return Observation(rank=rank, layout="layer_boundary", steps=steps, gate_after=True)


def test_a_route_other_than_the_decisions_fails_naming_the_tokens() -> None:
    doc = layer_run.policy_document(2)
    assert layer_run.policy_problems("policy-eager", [_rank(0, ROUTES), _rank(1, ROUTES)],
                                        doc, 2) == []
    stock = dict.fromkeys(ROUTES, "fused")  # a tree that ignores the policy
    problems = layer_run.policy_problems("policy-eager", [_rank(0, stock)], doc, 2)
    assert problems[0] == ("rank 0: at 9 tokens the route 'fused' ran, the policy's "
                           "decision is 'pcie_ipc'")
    assert len(problems) == 5


def test_a_wrong_output_a_missing_token_or_nothing_checked_fails() -> None:
    doc = layer_run.policy_document(2)
    wrong = layer_run.policy_problems("policy-graph", [_rank(1, ROUTES, wrong=(33,))],
                                         doc, 2)
    assert wrong == ["rank 1: output differs from the reference at 33 tokens "
                     "(sglang_dispatch)"]
    short = dict(list(ROUTES.items())[:-1])
    assert "planned" in layer_run.policy_problems("policy-eager", [_rank(0, short)],
                                                     doc, 2)[0]
    # a step that could not run here (a gloo all-reduce is not captured) is not judged on
    # its output, but its route still is, and not every step may be skipped
    skipped = _rank(0, ROUTES, wrong=(33, 64), skipped=(33, 64))
    assert layer_run.policy_problems("policy-graph", [skipped], doc, 2) == []
    every = _rank(0, ROUTES, skipped=tuple(ROUTES))
    assert layer_run.policy_problems("policy-graph", [every], doc, 2) == [
        "rank 0: every step was skipped: nothing was checked"]


def test_a_gpu_run_of_0523_plans_the_whole_matrix_and_the_policy_cases_on_each_route(
        tmp_path: Path) -> None:
    opts = layer_run.LayerOptions(command="x", sglang_path=tmp_path, out=tmp_path / "out",
                             layout="layer_boundary", routes=(layer_run.LayerRoute(
                                 variant="plugin", sglang_path=tmp_path),))
    planned = layer_run.planned_cases(opts)
    for variant in ("patched", "plugin"):
        cases = [c for v, c in planned if v == variant]
        assert "one-rank-fused-call-raises" in cases  # the plugin's 8th case last time
        assert "rank-0-fused-call-raises" in cases
        assert {"policy-eager", "policy-graph"} <= set(cases)
        assert len(cases) == 10
    old = layer_run.LayerOptions(command="x", sglang_path=tmp_path, out=tmp_path,
                            layout="communicator", device="cpu")
    assert not {"policy-eager", "policy-graph"} & {c for _, c in layer_run.planned_cases(old)}


def _outcome(case: str, variant: str) -> CaseOutcome:
    return CaseOutcome(case=case, passed=True, hung=False, problems=[],
                                    ranks=[], seconds=1.0, tails=[], variant=variant)


def test_the_time_budget_stops_starting_cases_and_the_record_says_what_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 0.0}
    ran: list[tuple[str, str]] = []

    def fake_case(case: str, **kwargs: Any) -> CaseOutcome:
        ran.append((kwargs["variant"], case))
        clock["now"] += 30.0
        return _outcome(case, kwargs["variant"])

    monkeypatch.setattr(layer_run, "time", SimpleNamespace(monotonic=lambda: clock["now"]))
    monkeypatch.setattr(layer_run, "run_case", fake_case)
    made: Provenance = {"stack": "sglang-0.5.23", "made_from": [
        {"project": "sglang", "wheel": "sglang-0.5.23+sm120.1-cp312-cp312-x.whl",
         "wheel_sha256": "e" * 64}]}
    route = layer_run.LayerRoute(variant="plugin", sglang_path=tmp_path, made_from=(
        {"project": "sglang@plugin", "variant": "plugin", "wheel": "p.whl",
         "wheel_sha256": "f" * 64},))
    opts = layer_run.LayerOptions(command="x", sglang_path=tmp_path, out=tmp_path / "out",
                             layout="layer_boundary", made=made, routes=(route,),
                             time_budget=200.0, record_command="nox -s sglang_layer")
    outcomes = layer_run.run_sglang_layer(opts)
    # 30 s a case, none starts once 60 s (its estimate) would pass the budget: 5 ran
    assert len(ran) == len(outcomes) == 5
    rec = json.loads((tmp_path / "out" / "record.json").read_text())
    assert (rec["planned"], rec["finished"], rec["verdict"]) == (20, False, "unfinished")
    assert [c["id"] for c in rec["cases"]] == [c for _, c in ran]
    assert len(rec["not_run"]) == 15
    assert rec["not_run"][-1] == ("plugin policy-graph: not started, the time budget "
                                  "(200 s) ran out")
    assert {w["variant"] for w in rec["tested"]["wheels"]} == {"patched", "plugin"}


def test_every_planned_case_on_both_routes_makes_a_finished_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layer_run, "run_case",
                        lambda case, **kw: _outcome(case, kw["variant"]))
    made: Provenance = {"stack": "sglang-0.5.23", "made_from": []}
    opts = layer_run.LayerOptions(command="x", sglang_path=tmp_path, out=tmp_path / "out",
                             layout="layer_boundary", made=made, jobs=3, routes=(
                                 layer_run.LayerRoute(variant="plugin", sglang_path=tmp_path),))
    layer_run.run_sglang_layer(opts)
    rec = json.loads((tmp_path / "out" / "record.json").read_text())
    assert (rec["planned"], rec["finished"], rec["verdict"]) == (20, True, "pass")
    ids = {(c["variant"], c["id"]) for c in rec["cases"]}
    assert ("plugin", "one-rank-fused-call-raises") in ids
    assert ("plugin", "policy-graph") in ids
    assert ("patched", "policy-eager") in ids
    assert records.PATH_OPTIONS[-2:] == ("--plugin-wheel", "--stock-wheel")


def test_the_plugin_route_takes_a_kits_plugin_and_stock_sglang(tmp_path: Path) -> None:
    """In a kit, ``--with-plugin-route`` finds the plugin in stack/plugin/ and stock SGLang
    where kit.json's plugin_route names it; the record lists both by sha256."""
    import zipfile

    from sm120fork.errors import ConfigError
    from sm120fork.gpu.core import stack_wheels

    kit = tmp_path / "kit"
    (kit / "stack" / "plugin").mkdir(parents=True)
    (kit / "upstream").mkdir()
    plugin = kit / "stack" / "plugin" / "sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl"
    stock = kit / "upstream" / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    for wheel, top in ((plugin, "sm120fork_sglang_plugin"), (stock, "sglang")):
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{top}/__init__.py", top)
    with pytest.raises(ConfigError, match="no stock SGLang wheel"):
        stack_wheels.plugin_route_wheels(kit / "stack")
    (kit / "kit.json").write_text(json.dumps({"plugin_route": {
        "plugin": f"stack/plugin/{plugin.name}", "sglang": f"upstream/{stock.name}"}}))
    assert stack_wheels.plugin_route_wheels(kit / "stack") == (plugin, stock)
    tree, site, rows = stack_wheels.plugin_trees(stock, plugin, tmp_path / "work",
                                                 "sglang-0.5.23")
    assert (tree / "sglang" / "__init__.py").read_text() == "sglang"
    assert (site / "sm120fork_sglang_plugin" / "__init__.py").is_file()
    assert [(r["project"], r["variant"], r["wheel"]) for r in rows] == [
        ("sglang", "upstream", stock.name), ("sglang@plugin", "plugin", plugin.name)]


def _wheel(path: Path, top: str) -> str:
    import hashlib
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{top}/__init__.py", path.name)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_one_command_runs_both_routes_of_a_kit_into_one_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sglang-layer --stack-dir KIT/stack --with-plugin-route``: every case on the patched
    wheel and on stock SGLang + the plugin, one record naming all four wheels; a run cut
    short by its time budget exits non-zero."""
    from sm120fork.gpu import cli

    kit = tmp_path / "kit"
    (kit / "stack" / "plugin").mkdir(parents=True)
    (kit / "upstream").mkdir()
    rows = [entry(project, wheel=name, sha256=_wheel(kit / "stack" / name, top))
            for project, name, top in (
                ("sglang", "sglang-0.5.23+sm120.1-py3-none-any.whl", "sglang"),
                ("flashinfer", "flashinfer_python-0.7.2-py3-none-any.whl", "flashinfer"))]
    write_manifest(kit / "stack", "sglang-0.5.23", *rows)
    plugin = "sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl"
    stock = "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    _wheel(kit / "stack" / "plugin" / plugin, "sm120fork_sglang_plugin")
    _wheel(kit / "upstream" / stock, "sglang")
    (kit / "kit.json").write_text(json.dumps({"plugin_route": {
        "plugin": f"stack/plugin/{plugin}", "sglang": f"upstream/{stock}"}}))
    seen: list[tuple[str, str, bool]] = []

    def fake_case(case: str, **kw: Any) -> CaseOutcome:
        seen.append((kw["variant"], case, kw["load_plugins"]))
        return _outcome(case, kw["variant"])

    monkeypatch.setattr(layer_run, "run_case", fake_case)
    out = tmp_path / "out"
    argv = ["sglang-layer", "--stack-dir", str(kit / "stack"), "--work-dir",
            str(tmp_path / "work"), "--device", "cpu", "--layout", "layer_boundary",
            "--with-plugin-route", "--case", "fused", "--case", "policy-graph",
            "--out", str(out)]
    assert cli.main(argv) == 0
    assert seen == [("patched", "fused", False), ("plugin", "fused", True),
                    ("patched", "policy-graph", False), ("plugin", "policy-graph", True)]
    rec = json.loads((out / "record.json").read_text())
    assert (rec["planned"], rec["finished"], rec["verdict"]) == (4, True, "pass")
    assert {(w["variant"], w["file"]) for w in rec["tested"]["wheels"]} == {
        ("patched", rows[0]["wheel"]), ("patched", rows[1]["wheel"]),
        ("upstream", stock), ("plugin", plugin)}
    assert str(tmp_path) not in json.dumps(rec)
    assert cli.main([*argv, "--time-budget", "1"]) != 0  # nothing starts: cut short


def test_the_route_is_the_one_function_that_ran() -> None:
    """The rank's spy: exactly one of the fused kernel, SGLang's pcie_ipc entry and the
    plain all-reduce ran for a step; anything else is named as a mix, never a route."""
    from sm120fork.gpu.layer.rank import RouteSpy

    class Group:
        all_reduce_calls = 0

    class Kernels:
        def trtllm_allreduce_fusion(self) -> None:
            return None

        def pcie_ipc_all_reduce(self) -> None:
            return None

    group, kernels = Group(), Kernels()
    spy = RouteSpy(group)  # type: ignore[arg-type]
    spy.wrap(kernels, "trtllm_allreduce_fusion", "fused")
    spy.wrap(kernels, "pcie_ipc_all_reduce", "pcie_ipc")
    spy.start()
    kernels.trtllm_allreduce_fusion()
    assert spy.route() == "fused"
    spy.start()
    kernels.pcie_ipc_all_reduce()
    assert spy.route() == "pcie_ipc"
    spy.start()
    group.all_reduce_calls += 1
    assert spy.route() == "sglang_dispatch"
    spy.start()
    kernels.trtllm_allreduce_fusion()
    group.all_reduce_calls += 1  # the fused call declined and the fallback all-reduced
    assert spy.route() == ("mixed (trtllm_allreduce_fusion 1, pcie_ipc 0, plain "
                           "all-reduce 1)")
    spy.start()
    assert spy.route().startswith("mixed")  # nothing ran
