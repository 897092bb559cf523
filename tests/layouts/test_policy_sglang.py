"""Both stacks' patched SGLang read the all-reduce policy the bench writes (issue 22 item 2).

The real patched modules are imported on CPU with the GPU faked, as the SGLang probes do
(``sm120fork.verify.sglang*_probe``): the start-up decision (S2 / G2+G7) follows the
policy when one is usable and names it, keeps today's rule when none is (and says why),
and the fused path (S1 / G3+G7) is never taken above the policy's cap: 0.5.10's S1 reads
``fused_max_tokens`` (version 1), 0.5.23's G7 the same cap as a version 2 range.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sm120fork.patch.tree import prepare_tree
from sm120fork.resolved import ResolvedStack
from sm120fork.workspace import Workspace

from helpers_sglang import STACK
from helpers_ws import checkout_copy

pytestmark = [pytest.mark.network, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _entry(cap: int, version: int) -> dict[str, Any]:
    """Our fused path up to ``cap`` tokens, as each version says it."""
    if version == 1:
        return {"fused_max_tokens": cap, "ranges": []}
    return {"ranges": [{"min_tokens": 1, "max_tokens": cap, "method": "fused_auto",
                        "fallback": ["nccl_rmsnorm"]}] if cap else []}


def _policy(tmp: Path, name: str, tp: dict[str, int], *, version: int,
            for_use: bool = True) -> str:
    path = tmp / f"{name}-v{version}.json"
    path.write_text(json.dumps({
        "format": "sm120fork-allreduce-policy", "version": version, "for_use": for_use,
        "made": {"created": "2026-12-01T20:00:00+00:00", "gpu": "RTX PRO 6000",
                 "gpu_count": 8},
        "tp": {k: _entry(v, version) for k, v in tp.items()}}))
    return str(path)


def _policies(tmp: Path, version: int) -> dict[str, str]:
    """The policy files the cases read: one capped per TP size, one measured on a shared
    GPU (not for use), and a path where there is none."""
    return {"cap64": _policy(tmp, "cap64", {"2": 64, "4": 0, "8": 128}, version=version),
            "shared": _policy(tmp, "shared", {"2": 64}, version=version, for_use=False),
            "missing": str(tmp / "absent.json")}


@pytest.fixture
def policies(tmp_path: Path) -> dict[str, str]:
    """Version 1: what 0.5.10's S1 reads."""
    return _policies(tmp_path, 1)


@pytest.fixture
def policies_v2(tmp_path: Path) -> dict[str, str]:
    """Version 2: what 0.5.23's G7 reads."""
    return _policies(tmp_path, 2)


def _cases(policies: dict[str, str]) -> list[list[Any]]:
    """The cases both stacks run: [name, policy file, TP size, the explicit override]."""
    cap64 = policies["cap64"]
    return [["absent", policies["missing"], 2, None], ["cap64", cap64, 2, None],
            ["beaten", cap64, 4, None], ["tp8", cap64, 8, None],
            ["not-for-use", policies["shared"], 2, None], ["env-wins", cap64, 2, "0"]]


S510 = textwrap.dedent("""\
    import json, os, sys
    from sm120fork.harness.fake_gpu import start_probe
    from sm120fork.layouts import communicator as p
    start_probe([12, 0])
    common = p._module("sglang.srt.utils.common")
    communicator = p._module("sglang.srt.layers.communicator")
    out = {}
    for name, policy, tp, env in json.loads(sys.argv[1]):
        common.sm120_allreduce_policy.cache_clear()
        os.environ["SGLANG_SM120_ALLREDUCE_POLICY"] = policy
        obs = p._decide(tp=tp, explicit=False, env=env, enforce_disable=False)
        fused = {n: bool(communicator.apply_flashinfer_allreduce_fusion(n))
                 for n in (1, 64, 65, 600)}
        out[name] = {"flag": obs["observed"]["flag"], "fused": fused,
                     "detail": obs["detail"]}
    print("RESULT " + json.dumps(out))
""")


def _run(python: str, tree: Path, script: str, scenarios: list[Any],
         overlay: Path | None = None) -> dict[str, Any]:
    paths = [str(overlay)] if overlay else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(tree / "python"),
                                                        str(REPO / "src")])}
    proc = subprocess.run([python, "-c", script, json.dumps(scenarios)], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


@pytest.fixture(scope="module")
def tree_510(sglang_0510: Path) -> Path:
    """The patched 0.5.10 tree the run shares (helpers_sglang), read only."""
    return sglang_0510


def test_sglang_0510_follows_the_policy_and_names_it(tree_510: Path, policies: dict[str, str],
                                                      zygote_python: str) -> None:
    cap64, missing = policies["cap64"], policies["missing"]
    got = _run(zygote_python, tree_510, S510, _cases(policies))
    # no policy: today's rule (TP2 on), no cap, and the line says why
    assert got["absent"]["flag"] is True
    assert got["absent"]["fused"] == {"1": True, "64": True, "65": True, "600": True}
    assert f"default rule: no policy at {missing}" in got["absent"]["detail"]
    # a policy: the fused path only up to its cap, the line names the file
    assert got["cap64"]["flag"] is True
    assert got["cap64"]["fused"] == {"1": True, "64": True, "65": False, "600": False}
    assert f"policy {cap64} (measured 2026-12-01" in got["cap64"]["detail"]
    assert "won for 1-64 tokens" in got["cap64"]["detail"]
    # beaten everywhere at TP4: not auto-enabled; TP8 auto-enabled (the policy, not TP2-only)
    assert got["beaten"]["flag"] is False
    assert "a measured method beat the fused path at TP4" in got["beaten"]["detail"]
    assert got["tp8"]["flag"] is True
    assert got["tp8"]["fused"]["600"] is False
    # a shared-GPU policy is ignored, and the line says so
    assert got["not-for-use"]["flag"] is True
    assert got["not-for-use"]["fused"]["600"] is True
    assert "marked not for use" in got["not-for-use"]["detail"]
    # the explicit override still wins over the policy
    assert got["env-wins"]["flag"] is False


S523 = textwrap.dedent("""\
    import importlib, json, os, sys
    from sm120fork.harness.fake_gpu import start_probe
    start_probe([12, 0])
    from sm120fork.layouts import layer_boundary as lb
    ctx = importlib.import_module("sglang.srt.runtime_context")
    add_norm = importlib.import_module("sglang.srt.layers.layer_boundary.residual.add_norm")
    out = {}
    for name, policy, tp, env in json.loads(sys.argv[1]):
        os.environ["SGLANG_SM120_ALLREDUCE_POLICY"] = policy
        importlib.import_module("sglang.srt.layers.sm120fork_allreduce").sglang_forget()
        obs = lb._auto_case(tp=tp, nodes=1, env=env)
        with ctx.get_context().override_server_args(
                flashinfer_allreduce_fusion_backend="trtllm", tp_size=tp), \\
                ctx.get_parallel().override(tp_size=tp):
            fused = {n: bool(add_norm.flashinfer_ar_fusion_applies(n))
                     for n in (1, 64, 65, 600)}
        out[name] = {"backend": obs["observed"]["backend"], "fused": fused,
                     "detail": obs["detail"]}
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def tree_523(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The patched 0.5.23 tree (of the stack verified: helpers_sglang.STACK) and the
    layer_boundary probe's overlay."""
    from sm120fork.layouts.layer_boundary import ensure_overlay

    # The pinned wheels come from the checkout's download cache, which the copy shares.
    root = checkout_copy(tmp_path_factory.mktemp("s523"))
    ws = Workspace(root)
    stack = ws.stack(STACK)
    series = ResolvedStack.of(ws, stack).series["sglang"]
    tree = prepare_tree(ws, stack, stack.project("sglang"), patches=series.patches).path
    return tree, ensure_overlay(root / ".forks" / "probe")


@pytest.mark.runs_stack(STACK)
def test_sglang_0523_follows_the_policy_and_names_it(tree_523: tuple[Path, Path],
                                                      policies_v2: dict[str, str],
                                                      zygote_python: str) -> None:
    """G2's auto-enable and G3's fused-path gate (the functions the plugin replaces too)."""
    tree, overlay = tree_523
    cap64, missing = policies_v2["cap64"], policies_v2["missing"]
    got = _run(zygote_python, tree, S523, _cases(policies_v2), overlay)
    assert got["absent"]["backend"] == "auto"
    assert got["absent"]["fused"] == {"1": True, "64": True, "65": True, "600": True}
    assert f"no policy at {missing}" in got["absent"]["detail"]
    assert got["cap64"]["backend"] == "auto"
    assert got["cap64"]["fused"] == {"1": True, "64": True, "65": False, "600": False}
    assert f"policy {cap64}, measured 2026-12-01" in got["cap64"]["detail"]
    assert "fused_auto for 1-64, nccl_rmsnorm for 65+ tokens" in got["cap64"]["detail"]
    assert got["beaten"]["backend"] is None
    assert "names no range for it at TP4" in got["beaten"]["detail"]
    assert got["beaten"]["fused"]["1"] is False  # cap 0: never, even when enabled
    assert got["tp8"]["backend"] == "auto"
    assert got["tp8"]["fused"]["600"] is False
    assert got["not-for-use"]["backend"] == "auto"
    assert got["not-for-use"]["fused"]["600"] is True
    assert "marked not for use" in got["not-for-use"]["detail"]
    assert got["env-wins"]["backend"] is None


@pytest.mark.runs_stack(STACK)
def test_sglang_0523_off_sm12x_names_a_policy_it_does_not_follow(
        tree_523: tuple[Path, Path], policies_v2: dict[str, str], zygote_python: str) -> None:
    """Off SM12x (an SM90 GPU) SGLang's own rule decides with or without a policy file;
    a file it finds and does not follow is named in one start-up line with why (the
    H200 trial of issue 33: tune installs a not-for-use policy there), none without one."""
    tree, overlay = tree_523
    shared, cap64, missing = (policies_v2["shared"], policies_v2["cap64"],
                              policies_v2["missing"])
    sm90 = S523.replace("start_probe([12, 0])", "start_probe([9, 0])")
    assert sm90 != S523
    got = _run(zygote_python, tree, sm90,
               [["absent", missing, 2, None], ["not-for-use", shared, 2, None],
                ["other-gpu", cap64, 2, None]], overlay)
    # the decision is SGLang's SM90 rule every time: the file changes nothing
    assert {name: case["backend"] for name, case in got.items()} == {
        "absent": "auto", "not-for-use": "auto", "other-gpu": "auto"}
    assert all(case["fused"] == {"1": True, "64": True, "65": True, "600": True}
               for case in got.values())
    assert "sm120fork" not in got["absent"]["detail"]
    assert (f"sm120fork all-reduce at TP2: SGLang's own code, as upstream (policy {shared} "
            "is marked not for use") in got["not-for-use"]["detail"]
    assert (f"sm120fork all-reduce at TP2: SGLang's own code, as upstream (policy {cap64} "
            "was measured on RTX PRO 6000") in got["other-gpu"]["detail"]
