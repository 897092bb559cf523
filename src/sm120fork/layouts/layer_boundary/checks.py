"""Layout ``layer_boundary`` (SGLang 0.5.23): behaviour checks of G1-G5 (patches/README.md)
on a CPU, the tree's real gate functions with only the GPU faked; on 8.0/9.0/10.0 every
observation equals the unpatched baseline's.  Its newer packages go into an overlay first
on the probe's path (:func:`ensure_overlay`)."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sm120fork.errors import CommandError, VerifyError
from sm120fork.layouts.results import (
    CheckResult,
    LayerRunner,
    Observation,
    compact,
    gather,
    judged,
    sglang_trees,
)
from sm120fork.layouts.results import run_probe as run_probe_module
from sm120fork.util import proc
from sm120fork.util.files import made_once

PROBE_MODULE = "sm120fork.layouts.layer_boundary.probe"
OVERLAY_REQUIREMENTS = Path(__file__).with_name("requirements.txt")
SUITES = ("resolve", "auto", "applies", "plain", "preflight")
SM12X = ("12.0", "12.1")
UNCHANGED = ("8.0", "9.0", "10.0")
AUTO_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
PLAIN_ENV = "SGLANG_SM120_FLASHINFER_PLAIN_ALLREDUCE"
PREFLIGHT_BASELINE = "9.0"
GATE = {"resolve": "G1", "auto": "G2", "applies": "G3", "preflight": "G4", "plain": "G5"}


def ensure_overlay(cache_dir: Path, *, python: str | os.PathLike[str] = sys.executable,
                   requirements: Path = OVERLAY_REQUIREMENTS) -> Path:
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]

    def install(target: Path) -> None:
        try:
            proc.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target",
                      str(target), "-r", str(requirements)])
        except CommandError as exc:
            raise VerifyError("installing the layer_boundary probe overlay failed",
                              where=str(requirements), detail=exc.detail,
                              fix="check the package index is reachable") from exc

    return made_once(cache_dir / f"overlay-{digest}", digest, install)


def probe_path(cache: Path, python: str | os.PathLike[str]) -> list[str]:
    return [str(ensure_overlay(cache, python=python))]


def run_probe(tree: Path, capability: str, *, overlay: Path,
              python: str | os.PathLike[str] = sys.executable,
              timeout: float = 600) -> list[Observation]:
    package_root = Path(__file__).resolve().parents[3]
    request = {"capability": [int(part) for part in capability.split(".")],
               "suites": list(SUITES)}
    env = {
        "PYTHONPATH": os.pathsep.join([str(overlay), str(tree / "python"), str(package_root)]),
        # The fork tree stays clean.  Not PYTHONPYCACHEPREFIX: installed modules' byte code
        # would go unread (25 s of CPU a probe instead of 11).
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return run_probe_module(
        PROBE_MODULE, request, tree=tree, env=env, python=python, timeout=timeout,
        what=f"the layer_boundary probe (capability {capability})",
        fix="install the probe's requirements and its overlay")


def _env(scenario: str, variable: str) -> str | None:
    _, sep, value = scenario.partition(f"{variable}=")
    return value.split()[0] if sep else None


def expected_sm12x(name: str) -> Any:
    suite, _, scenario = name.partition(": ")
    words = scenario.split()
    if suite == "resolve":
        backend, nodes = words[0], words[1]
        return "trtllm" if backend in ("auto", "trtllm") and nodes == "nodes1" else "error"
    if suite == "auto":
        return _expected_auto(scenario)
    if suite == "applies":
        return scenario == "backend=trtllm batch16"
    if suite == "plain":
        if scenario.startswith("backend=None"):
            return {"flashinfer_plain_allreduce": False, "sm12x_log_lines": 0}
        env = _env(scenario, PLAIN_ENV)
        if env not in (None, "0", "off", "1", "on"):
            return "error"
        return {"flashinfer_plain_allreduce": env in ("1", "on"), "sm12x_log_lines": 1}
    raise KeyError(name)


def _expected_auto(scenario: str) -> Any:
    words = scenario.split()
    off = {"backend": None, "runs": None, "sm12x_log_lines": 1}
    if scenario.startswith("enforce-disable"):
        return off
    if scenario.startswith("explicit-trtllm"):
        return {"backend": "trtllm", "runs": "trtllm", "sm12x_log_lines": 1}
    tp, nodes = int(words[1].removeprefix("tp")), words[2]
    env = _env(scenario, AUTO_ENV)
    if env not in (None, "0", "off", "1", "on"):
        return "error"
    on = {"backend": "auto", "runs": "trtllm", "sm12x_log_lines": 1}
    if nodes != "nodes1" or tp < 2 or env in ("0", "off"):
        return off
    return on if env in ("1", "on") or tp == 2 else off


def _by_name(observations: Iterable[Observation]) -> dict[str, Observation]:
    return {o.name: o for o in observations}


def judge(observed: Mapping[tuple[str, str], Sequence[Observation]]) -> list[CheckResult]:
    results: list[CheckResult] = []
    # The preflight sizing does not depend on the capability: one baseline serves all.
    base_preflight = _by_name(observed[("baseline", PREFLIGHT_BASELINE)])
    for cap in SM12X:
        for name, obs in _by_name(observed[("patched", cap)]).items():
            suite = name.partition(": ")[0]
            if suite == "preflight":
                results.append(_preflight_check(name, cap, obs, base_preflight))
                continue
            expected = expected_sm12x(name)
            # A refusal on SM12x must say why in SM12x terms, not "requires SM90".
            needs = "SM12x" if suite == "resolve" and expected == "error" else ""
            results.append(judged(obs, expected, cap, GATE[suite], require_in_detail=needs))
    for cap in UNCHANGED:
        baseline = _by_name(observed[("baseline", cap)])
        for name, obs in _by_name(observed[("patched", cap)]).items():
            if name not in baseline:
                raise VerifyError(f"the baseline probe has no observation {name!r}",
                                  fix="run both trees with the same probe")
            if name.startswith("preflight: "):
                # G4 is not SM12x-only: any GPU without multicast (H100 PCIe too) gains.
                results.append(_preflight_check(name, cap, obs, baseline))
                continue
            results.append(judged(obs, baseline[name].observed, cap, "unchanged",
                                  note="(expected = unpatched upstream)"))
    return results


def _preflight_check(name: str, cap: str, obs: Observation,
                     baseline: Mapping[str, Observation]) -> CheckResult:
    """Without multicast: upstream's sizes at allocation granularity, never asking for mc."""
    scenario = name.partition(": ")[2]
    upstream = compact(baseline[name].observed)
    if scenario == "no multicast":
        reference = baseline["preflight: multicast at allocation granularity"].observed
        expected: object = {"multicast_queried": False, "sizes": reference.get("sizes")
                            if isinstance(reference, dict) else None}
        note = (f"(expected sizes = upstream's when multicast granularity equals allocation "
                f"granularity; unpatched upstream here: {upstream})")
    else:
        expected = baseline[name].observed
        note = "(expected = unpatched upstream)"
    return judged(obs, expected, cap, "G4", note=note)


def check(tree: Path, *, baseline: Path | None, python: str | os.PathLike[str],
          cache: Path, layer: LayerRunner) -> list[CheckResult]:
    """``tree`` against ``baseline`` (unpatched upstream); a probe that cannot run raises.
    (The G series has no two-rank layer cases: ``layer`` is unused.)"""
    if baseline is None:
        raise VerifyError("the layer_boundary checks compare with unpatched upstream",
                          where=str(tree), fix="pass the unpatched tree as baseline")
    sglang_trees(tree, baseline)
    overlay = ensure_overlay(cache, python=python)
    runs = [("patched", tree, cap) for cap in SM12X + UNCHANGED]
    runs += [("baseline", baseline, cap) for cap in UNCHANGED]
    return judge(gather({(label, cap): functools.partial(
        run_probe, root, cap, overlay=overlay, python=python)
        for label, root, cap in runs}, max(1, min(len(runs), os.cpu_count() or 1))))
