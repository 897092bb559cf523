"""Layout ``communicator`` (SGLang 0.5.10): behaviour checks S1-S4 of a patched tree on a
CPU, the tree's real modules with only the GPU faked, one interpreter per capability; on
8.0/9.0/10.0 the decisions equal unpatched upstream's."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sm120fork.layouts.results import (
    REQUIREMENTS,
    CheckResult,
    LayerOutcome,
    LayerRunner,
    Observation,
    compact,
    gather,
    judged,
    sglang_trees,
)
from sm120fork.layouts.results import run_probe as run_probe_module

PROBE_MODULE = "sm120fork.layouts.communicator.probe"

SM12X = ("12.0", "12.1")
UNCHANGED = ("8.0", "9.0", "10.0")
SM120_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"

ON = {"flag": True, "fused": True}
OFF = {"flag": False, "fused": False}
FLAG_ONLY = {"flag": True, "fused": False}
#: The CUDA below which FlashInfer cannot build for SM12x (S1/S2 gate on it).
OLD_CUDA = "12.8"
#: S4's two-rank cases (gpu.layer.cases on the CPU), each judged there.
TOGETHER_CASES = ("fused", "all-ranks-create-fails", "one-rank-create-fails",
                  "one-rank-fails-midway", "one-rank-fails-late", "fused-call-raises",
                  "no-p2p", "one-rank-fails-in-fd-exchange")
#: S4's bound on FlashInfer's fd-socket receive (the tree's own: 30 s).
EXCHANGE_TIMEOUT_S = 3.0


def _tp(scenario: str) -> int:
    return int(scenario.partition(" tp")[2].split(maxsplit=1)[0])


def _env(scenario: str) -> str | None:
    _, sep, value = scenario.partition(f"{SM120_ENV}=")
    return value if sep else None


def _logged(decision: dict[str, bool]) -> dict[str, bool | int]:
    return {**decision, "sm12x_lines": 1}


def expected_sm12x(scenario: str, *, buildable: bool = True) -> Any:
    """What the series promises on SM12x (not ``buildable``: CUDA too old, fusion off)."""
    env = _env(scenario)
    if env is not None and env not in ("0", "off", "1", "on"):
        return "error"
    if not buildable or scenario.startswith("enforce-disable"):
        return _logged(OFF)
    if scenario.startswith("explicit-flag"):
        return _logged(ON)
    if env is None:
        return _logged(ON if _tp(scenario) == 2 else OFF)
    return _logged(OFF if env in ("0", "off") else ON)


def expected_upstream(capability: str, scenario: str) -> Any:
    """How unpatched upstream 0.5.10.post1 decides (no env var)."""
    quiet = {"sm12x_lines": 0}
    if scenario.startswith("enforce-disable"):
        return {**OFF, **quiet}
    fusion_arch = capability in ("9.0", "10.0")
    if scenario.startswith("explicit-flag"):
        return {**(ON if fusion_arch else FLAG_ONLY), **quiet}
    return {**(ON if fusion_arch and _tp(scenario) > 1 else OFF), **quiet}


#: The probe's "fallbacks" suite, run at 12.0: case -> (patch ID, expected observation).
FALLBACKS: dict[str, tuple[str, Any]] = {
    "fused call returns None": ("S3", {"attention_tp_all_reduce_calls": 1,
                                       "tp_all_reduce_calls": 0, "matches_reference": True}),
}


def probe_path(cache: Path, python: str | os.PathLike[str]) -> list[str]:
    return []


def run_probe(tree: Path, suite: str, capability: str | None, *,
              python: str | os.PathLike[str] = sys.executable,
              timeout: float = 600, cuda: str | None = None) -> list[Observation]:
    package_root = Path(__file__).resolve().parents[3]
    request: dict[str, object] = {"suite": suite}
    if capability is not None:
        request["capability"] = [int(part) for part in capability.split(".")]
    if cuda is not None:
        request["cuda"] = cuda
    env = {"PYTHONPATH": os.pathsep.join([str(tree / "python"), str(package_root)])}
    return run_probe_module(
        PROBE_MODULE, request, tree=tree, env=env, python=python, timeout=timeout,
        what=f"the SGLang probe ({suite}, capability {capability})",
        fix=f"install the probe's requirements: {REQUIREMENTS}")


def _decision_prefix(scenario: str) -> str:
    return "S1" if scenario.startswith("explicit-flag") else "S2"


def check(tree: Path, *, baseline: Path | None, layer: LayerRunner,
          python: str | os.PathLike[str] = sys.executable, cache: Path | None = None,
          jobs: int | None = None, timeout: float = 600) -> list[CheckResult]:
    """Without ``baseline`` 8.0/9.0/10.0 are compared with upstream's known decisions; a
    behaviour that differs is a failed result, a probe that cannot run ``VerifyError``.
    (``cache`` is unused: this layout needs no overlay.)"""
    sglang_trees(tree, baseline)
    runs: list[tuple[Path, str, str]] = [(tree, "decisions", cap) for cap in SM12X + UNCHANGED]
    runs.append((tree, "fallbacks", "12.0"))
    runs.append((tree, "decisions-old-cuda", "12.0"))
    if baseline is not None:
        runs += [(baseline, "decisions", cap) for cap in UNCHANGED]
    workers = jobs or max(1, min(len(runs), os.cpu_count() or 1))
    probes: dict[object, Callable[[], list[Observation] | LayerOutcome]] = {
        run: functools.partial(run_probe, run[0], run[1].removesuffix("-old-cuda"), run[2],
                               python=python, timeout=timeout,
                               cuda=OLD_CUDA if run[1].endswith("-old-cuda") else None)
        for run in runs}
    cases = {case: functools.partial(layer, case, sglang_path=tree / "python",
                                     layout="communicator", python=python, device="cpu",
                                     tokens=(3, 16), timeout=30, start_timeout=timeout,
                                     exchange_timeout_s=EXCHANGE_TIMEOUT_S)
             for case in TOGETHER_CASES}
    done = gather({**probes, **cases}, workers)
    observed = {run: obs for run in runs if isinstance(obs := done[run], list)}
    outcomes = {case: out for case in cases if not isinstance(out := done[case], list)}

    results: list[CheckResult] = []
    for cap in SM12X:
        results += [judged(obs, expected_sm12x(obs.name), cap, _decision_prefix(obs.name))
                    for obs in observed[(tree, "decisions", cap)]]
    for cap in UNCHANGED:
        if baseline is not None:
            upstream = {o.name: o.observed for o in observed[(baseline, "decisions", cap)]}
            note = "(expected = unpatched upstream tree)"
        else:
            upstream = {o.name: expected_upstream(cap, o.name)
                        for o in observed[(tree, "decisions", cap)]}
            note = "(expected = upstream 0.5.10.post1 decisions, no baseline tree)"
        results += [judged(obs, upstream[obs.name], cap, "unchanged", note=note)
                    for obs in observed[(tree, "decisions", cap)]]
    results += [judged(obs, expected_sm12x(obs.name, buildable=False),
                       f"12.0 CUDA {OLD_CUDA}", _decision_prefix(obs.name))
                for obs in observed[(tree, "decisions-old-cuda", "12.0")]]
    for obs in observed[(tree, "fallbacks", "12.0")]:
        check_id, expect = FALLBACKS[obs.name]
        results.append(judged(obs, expect, "12.0", check_id))
    for case, outcome in outcomes.items():
        results.append(_together_result(case, outcome))
    return results


def _together_result(case: str, outcome: LayerOutcome) -> CheckResult:
    observed = [{
        "paths": sorted({s.path for s in obs.steps}),
        "correct": all(s.correct for s in obs.steps),
        "warnings": len(obs.warnings),
        "fusion_after": obs.gate_after,
    } for obs in outcome.ranks]
    fused = case == "fused"
    expected = [{"paths": ["fused"] if fused else ["fallback", "unfused"], "correct": True,
                 "warnings": 0 if fused else 1, "fusion_after": fused}] * 2
    warnings = [obs.warnings[0] for obs in outcome.ranks if obs.warnings]
    detail = " | ".join([*outcome.problems, *warnings[:1]])
    return CheckResult(name=f"S4 two ranks: {case}", capability="12.0",
                       expected=compact(expected),
                       observed=compact(observed) if not outcome.hung else '"hung"',
                       passed=outcome.passed and observed == expected, detail=detail)
