"""Layout ``communicator`` (SGLang 0.5.10): behaviour checks of a patched tree, on a CPU.

The probe (``layouts.communicator.probe``) runs the tree's real ``server_args``,
``layers.communicator``, ``layers.layernorm`` and ``layers.flashinfer_comm_fusion`` with
only the GPU query faked, in a fresh interpreter per capability, so a patched and an
unpatched tree never meet in one process.  What is checked:

- SM120 and SM121: the explicit flag fuses at TP2/4/8; auto-enable only at TP2;
  ``SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO`` 0/off and 1/on override it, any other
  value is an error; the enforce-disable switch wins.
- 8.0, 9.0, 10.0: the decisions of unpatched upstream (the ``baseline`` tree, or without
  one, upstream 0.5.10.post1's known decisions).
- S3: a fused norm whose fused call returns None all-reduces, adds the residual and
  normalises (against a float64 reference).
- S4: no P2P, or a workspace that cannot be created, fails closed with one warning line
  and turns the fused gate off (two ranks of the GPU layer harness, on the CPU).
"""

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
#: The bound the checks give S4 on FlashInfer's POSIX-fd socket receive (the tree's own:
#: 30 s), so the case that waits for it does not wait half a minute.
EXCHANGE_TIMEOUT_S = 3.0


def _tp(scenario: str) -> int:
    return int(scenario.partition(" tp")[2].split(maxsplit=1)[0])


def _env(scenario: str) -> str | None:
    _, sep, value = scenario.partition(f"{SM120_ENV}=")
    return value if sep else None


def _logged(decision: dict[str, bool]) -> dict[str, bool | int]:
    """On SM12x every decision is logged in exactly one start-up line."""
    return {**decision, "sm12x_lines": 1}


def expected_sm12x(scenario: str, *, buildable: bool = True) -> Any:
    """What the series promises on SM120/SM121 for one decision scenario.

    ``buildable`` False: CUDA below what FlashInfer needs for SM12x; fusion stays off.
    """
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
    """How unpatched upstream 0.5.10.post1 decides on 8.0 / 9.0 / 10.0 (no env var)."""
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
    """What goes first on a probe's ``PYTHONPATH`` for this layout: nothing."""
    return []


def run_probe(tree: Path, suite: str, capability: str | None, *,
              python: str | os.PathLike[str] = sys.executable,
              timeout: float = 600, cuda: str | None = None) -> list[Observation]:
    """Run one probe suite against ``tree`` in a fresh interpreter; its observations."""
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


def check_sglang(tree: Path, *, baseline: Path | None, layer: LayerRunner,
                 python: str | os.PathLike[str] = sys.executable,
                 jobs: int | None = None, timeout: float = 600) -> list[CheckResult]:
    """Check the SM12x behaviour of ``tree`` and that 8.0/9.0/10.0 decide as upstream.

    ``tree`` and ``baseline`` are repository roots with the package under ``python/``
    (``baseline`` unpatched upstream; None compares 8.0/9.0/10.0 with the known upstream
    decisions instead).  ``python`` is an interpreter with the ``sglang-probe`` group
    installed; ``layer`` runs one two-rank case of the GPU layer harness on the CPU
    (:func:`sm120fork.gpu.layer.cases.run_case`).  Raises ``VerifyError`` if a probe
    cannot run; a behaviour that differs is a result with ``passed=False``, not an
    exception.
    """
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
    """One two-rank case: every rank's paths, correctness, warnings and gate afterwards."""
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


def check(tree: Path, *, baseline: Path | None, python: str | os.PathLike[str],
          cache: Path, layer: LayerRunner) -> list[CheckResult]:
    """The layout's entry point for ``verify-sm120`` (``cache`` is unused here)."""
    return check_sglang(tree, baseline=baseline, layer=layer, python=python)
