"""Behaviour checks of a patched SGLang tree, on a CPU machine.

The SGLang series (S1-S4) changes decisions that depend on the GPU, so the checks run
the real ``server_args``, ``layers.communicator``, ``layers.layernorm`` and
``layers.flashinfer_comm_fusion`` of a tree with only the GPU query faked (see
``verify.sglang_probe``).  Every probe runs in its own interpreter with
``PYTHONPATH=<tree>/python``, so a patched and an unpatched tree never meet in one
process and the module-level GPU gates are evaluated afresh per capability.

What is checked:

- SM120 and SM121 (12.0, 12.1): the explicit flag fuses at TP2/4/8; auto-enable only at
  TP2; ``SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO`` 0/off and 1/on override it, and
  any other value is an error; the enforce-disable switch wins.
- 8.0, 9.0, 10.0: the same decisions as unpatched upstream (the ``baseline`` tree), or,
  without a baseline, as upstream 0.5.10.post1 is known to decide.
- S3: a fused norm whose fused call returns None all-reduces, then adds the residual and
  normalises (compared with a float64 reference on the CPU).
- S4: no P2P between the GPUs, or a workspace that cannot be created, fails closed with one
  warning line and turns the fused gate off.

The probe's Python needs the ``sglang-probe`` dependency group of pyproject.toml (CPU
torch and what those modules import); pass that interpreter as ``python``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120fork.errors import CommandError, VerifyError
from sm120fork.util import proc

PROBE_MODULE = "sm120fork.verify.sglang_probe"
RESULT_MARKER = "SM120FORK-PROBE-RESULT "
REQUIREMENTS = "pip install --group sglang-probe  # in the checkout, pip >= 25.1"

SM12X = ("12.0", "12.1")
UNCHANGED = ("8.0", "9.0", "10.0")
SM120_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"

ON = {"flag": True, "fused": True}
OFF = {"flag": False, "fused": False}
FLAG_ONLY = {"flag": True, "fused": False}


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One observed behaviour against the one expected; values are compact JSON."""

    name: str
    capability: str
    expected: str
    observed: str
    passed: bool
    detail: str


def _tp(scenario: str) -> int:
    return int(scenario.partition(" tp")[2].split(maxsplit=1)[0])


def _env(scenario: str) -> str | None:
    _, sep, value = scenario.partition(f"{SM120_ENV}=")
    return value if sep else None


def expected_sm12x(scenario: str) -> Any:
    """What the series promises on SM120/SM121 for one decision scenario."""
    if scenario.startswith("enforce-disable"):
        return OFF
    if scenario.startswith("explicit-flag"):
        return ON
    env = _env(scenario)
    if env is None:
        return ON if _tp(scenario) == 2 else OFF
    if env in ("0", "off"):
        return OFF
    if env in ("1", "on"):
        return ON
    return "error"


def expected_upstream(capability: str, scenario: str) -> Any:
    """How unpatched upstream 0.5.10.post1 decides on 8.0 / 9.0 / 10.0 (no env var)."""
    if scenario.startswith("enforce-disable"):
        return OFF
    fusion_arch = capability in ("9.0", "10.0")
    if scenario.startswith("explicit-flag"):
        return ON if fusion_arch else FLAG_ONLY
    return ON if fusion_arch and _tp(scenario) > 1 else OFF


def _fail_closed(*, names_gpus: bool) -> dict[str, Any]:
    return {
        "gate_before": True,
        "workspace_ready": [False, False],
        "unavailable": True,
        "gate_after": False,
        "warnings": 1,
        "one_line": True,
        "says_unfused": True,
        "names_gpus": names_gpus,
    }


#: The probe's "fallbacks" suite, run at 12.0: case -> (patch ID, expected observation).
FALLBACKS: dict[str, tuple[str, Any]] = {
    "fused call returns None": ("S3", {"all_reduce_calls": 1, "matches_reference": True}),
    "no P2P between the GPUs": ("S4", _fail_closed(names_gpus=True)),
    "workspace creation raises": ("S4", _fail_closed(names_gpus=False)),
}


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def run_probe(tree: Path, suite: str, capability: str | None, *,
              python: str | os.PathLike[str] = sys.executable,
              timeout: float = 600) -> list[dict[str, Any]]:
    """Run one probe suite against ``tree`` in a fresh interpreter; its observations."""
    package_root = Path(__file__).resolve().parents[2]
    request: dict[str, Any] = {"suite": suite}
    if capability is not None:
        request["capability"] = [int(part) for part in capability.split(".")]
    env = {"PYTHONPATH": os.pathsep.join([str(tree / "python"), str(package_root)])}
    try:
        completed = proc.run([python, "-m", PROBE_MODULE, json.dumps(request)],
                             cwd=tree, env=env, timeout=timeout)
    except CommandError as exc:
        raise VerifyError(
            f"the SGLang probe ({suite}, capability {capability}) failed",
            where=str(tree),
            fix=f"install the probe's requirements: {REQUIREMENTS}",
            detail=exc.detail,
        ) from exc
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            results: list[dict[str, Any]] = json.loads(line.removeprefix(RESULT_MARKER))
            return results
    raise VerifyError(f"the SGLang probe ({suite}) printed no result", where=str(tree),
                      detail="\n".join(completed.stderr.splitlines()[-40:]))


def _results(observations: Iterable[Mapping[str, Any]], capability: str, prefix: str,
             expect: Mapping[str, Any], *, extra_detail: str = "") -> list[CheckResult]:
    results = []
    for obs in observations:
        name = str(obs["name"])
        expected, observed = _compact(expect[name]), _compact(obs["observed"])
        results.append(CheckResult(
            name=f"{prefix} {name}", capability=capability, expected=expected,
            observed=observed, passed=expected == observed,
            detail=" ".join(part for part in (str(obs["detail"]), extra_detail) if part),
        ))
    return results


def _decision_prefix(scenario: str) -> str:
    return "S1" if scenario.startswith("explicit-flag") else "S2"


def check_sglang(tree: Path, *, baseline: Path | None,
                 python: str | os.PathLike[str] = sys.executable,
                 jobs: int | None = None, timeout: float = 600) -> list[CheckResult]:
    """Check the SM12x behaviour of ``tree`` and that 8.0/9.0/10.0 decide as upstream.

    ``tree`` and ``baseline`` are repository roots with the package under ``python/``
    (``baseline`` unpatched upstream; None compares 8.0/9.0/10.0 with the known upstream
    decisions instead).  ``python`` is an interpreter with the ``sglang-probe`` group
    installed.  Raises ``VerifyError`` if a probe cannot run; a behaviour that differs is
    a result with ``passed=False``, not an exception.
    """
    for root in (tree, baseline):
        if root is not None and not (root / "python" / "sglang").is_dir():
            raise VerifyError("no python/sglang package directory", where=str(root),
                              fix="pass the repository root of an SGLang tree")
    runs: list[tuple[Path, str, str]] = [(tree, "decisions", cap) for cap in SM12X + UNCHANGED]
    runs.append((tree, "fallbacks", "12.0"))
    if baseline is not None:
        runs += [(baseline, "decisions", cap) for cap in UNCHANGED]
    workers = jobs or max(1, min(len(runs), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            run: pool.submit(run_probe, run[0], run[1], run[2], python=python, timeout=timeout)
            for run in runs
        }
        try:
            observed = {run: future.result() for run, future in futures.items()}
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    results: list[CheckResult] = []
    for cap in SM12X:
        for obs in observed[(tree, "decisions", cap)]:
            name = str(obs["name"])
            results += _results([obs], cap, _decision_prefix(name),
                                {name: expected_sm12x(name)})
    for cap in UNCHANGED:
        if baseline is not None:
            upstream = {str(o["name"]): o["observed"]
                        for o in observed[(baseline, "decisions", cap)]}
            note = "(expected = unpatched upstream tree)"
        else:
            upstream = {str(o["name"]): expected_upstream(cap, str(o["name"]))
                        for o in observed[(tree, "decisions", cap)]}
            note = "(expected = upstream 0.5.10.post1 decisions, no baseline tree)"
        results += _results(observed[(tree, "decisions", cap)], cap, "unchanged", upstream,
                            extra_detail=note)
    for obs in observed[(tree, "fallbacks", "12.0")]:
        name = str(obs["name"])
        check_id, expect = FALLBACKS[name]
        results += _results([obs], "12.0", check_id, {name: expect})
    return results
