"""Stock sglang 0.5.23 + our plugin follows the all-reduce policy (issue 22 item 2; network).

The real sglang 0.5.23 wheel, installed ``--no-deps``, with the plugin wheel built from the
real series (``helpers_sglang.sites``), runs SGLang's own ``load_plugins()`` and then the
two decisions the policy changes, through the names SGLang calls them by: G2's start-up
auto-enable (``model_hook._flashinfer_allreduce_fusion_auto_enable``) and G3's per-batch
gate (``add_norm.flashinfer_ar_fusion_applies``).  Only the GPU query is faked, and the
TP size is set on the module under test.  The policy is one the bench's own code derives
from measurements (``gpu/policy.derive``), so a method that beat the fused path at a token
count keeps the fused path away from it end to end.  The same cases on the patched
install (no plugin) must give the same answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sm120fork.gpu import policy
from sm120fork.plugin import package

from helpers_sglang import ROOT, Sites

pytestmark = [pytest.mark.network, pytest.mark.slow]

TOKENS = (1, 64, 65, 128, 129)

PROBE = textwrap.dedent("""\
    import importlib, json, logging, os, sys, types
    site, scenarios, load = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "plugin"
    sys.path.insert(0, site)
    from sm120fork.harness.fake_gpu import fake_gpu
    fake_gpu((12, 0))
    package = types.ModuleType("sglang")
    package.__path__ = [os.path.join(site, "sglang")]
    sys.modules["sglang"] = package

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.lines = []
        def emit(self, record):
            self.lines.append(record.getMessage())

    lines = Lines()
    logging.getLogger().addHandler(lines)
    logging.getLogger().setLevel(logging.INFO)
    if load:
        importlib.import_module("sglang.srt.plugins").load_plugins()
    reader = importlib.import_module(
        "sm120fork_sglang_plugin.gpu.policy" if load else "sm120fork.gpu.policy")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    model_hook = importlib.import_module("sglang.srt.arg_groups.model_hook")
    add_norm = importlib.import_module("sglang.srt.layers.layer_boundary.residual.add_norm")
    config = types.SimpleNamespace(hf_config=types.SimpleNamespace(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=4096),
        dtype=None)
    overrides.model_config_of = lambda view: config
    overrides.attn_dp_enabled_of = lambda view: False
    bag = types.SimpleNamespace(comm=types.SimpleNamespace(
        flashinfer_allreduce_fusion_backend="trtllm"))
    add_norm.is_dp_attention_enabled = lambda: False
    add_norm.get_exec = lambda: bag
    add_norm.uses_cutedsl_ar_fusion = lambda: False
    add_norm.is_flashinfer_allreduce_unavailable = lambda: False
    gate = add_norm.flashinfer_ar_fusion_applies
    out = {}
    for name, env, tps, tokens in scenarios:
        for key in ("SGLANG_SM120_ALLREDUCE_POLICY", "HOME"):
            os.environ.pop(key, None)
        os.environ.update(env)
        got = {"doctor_looks_at": str(reader.locate()), "tp": {}}
        for tp in tps:
            view = types.SimpleNamespace(
                tp_size=tp, nnodes=1, flashinfer_allreduce_fusion_backend=None,
                attn_cp_size=1, encoder_only=False, enable_pdmux=False,
                disable_custom_all_reduce=False, moe_a2a_backend="none")
            del lines.lines[:]
            backend = model_hook._flashinfer_allreduce_fusion_auto_enable(view).get(
                "flashinfer_allreduce_fusion_backend")
            said = [x for x in lines.lines if "usion" in x]
            vars(add_norm).pop("_sm120fork_policy_caps", None)  # G3 reads once a process
            add_norm.get_parallel = lambda tp=tp: types.SimpleNamespace(tp_size=tp)
            fused = {str(n): bool(gate(n)) for n in tokens}
            got["tp"][str(tp)] = {"backend": backend, "line": said[-1] if said else None,
                                  "fused": fused}
        out[name] = got
    print("POLICY-PROBE " + json.dumps(out, sort_keys=True))
""")


def _point(method: str, tokens: int, us: float) -> dict[str, Any]:
    return {"kind": "point", "method": method, "tokens": tokens, "hidden": 4096,
            "status": "timed", "median_us": us, "rank_medians_us": [us]}


def measured(*, for_use: bool = True) -> dict[str, Any]:
    """TP2: fused_auto wins 1-64, pcie_ipc beats it at 128; TP4: NCCL beats it at 1 token;
    TP8: fused_auto wins every measured count (1-128)."""
    tp2 = [_point("fused_auto", 1, 5), _point("pcie_ipc_rmsnorm", 1, 8),
           _point("fused_auto", 64, 9), _point("pcie_ipc_rmsnorm", 64, 10),
           _point("fused_auto", 128, 14), _point("pcie_ipc_rmsnorm", 128, 12)]
    tp4 = [_point("fused_auto", 1, 9), _point("nccl_rmsnorm", 1, 8)]
    tp8 = [_point("fused_auto", t, 6 + t / 32) for t in (1, 64, 128)] + [
        _point("nccl_rmsnorm", t, 40 + t / 8) for t in (1, 64, 128)]
    # G2/G3 of today's series read version 1 (the fork-only policy patch reads version 2)
    return policy.as_version_1(policy.derive({2: tp2, 4: tp4, 8: tp8}, for_use=for_use, made={
        "created": "2026-12-01T20:00:00+00:00", "gpu": "RTX PRO 6000", "gpu_count": 8}))


def run_cases(sites: Sites, *, plugin: bool, scenarios: list[Any]) -> dict[str, Any]:
    site = sites.stock if plugin else sites.patched
    paths = [str(sites.deps), str(ROOT / "src"), *([str(sites.plugin)] if plugin else [])]
    env = {k: v for k, v in os.environ.items() if k not in (
        policy.ENV_VAR, policy.AUTO_ENV, "SM120FORK_PLUGIN", "SGLANG_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    done = subprocess.run([sys.executable, "-c", PROBE, str(site), json.dumps(scenarios),
                           "plugin" if plugin else "patched"], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("POLICY-PROBE ")), None)
    assert line, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(line.removeprefix("POLICY-PROBE "))
    return result


def test_the_plugin_follows_the_policy_and_names_it(sites: Sites, tmp_path: Path) -> None:
    assert "gpu/policy.py" in package.vendored_files()
    home = tmp_path / "home"
    at_home = home / ".config" / "sm120fork" / "allreduce-policy.json"
    policy.write(measured(), at_home.parent)
    (at_home.parent / policy.FILE_NAME).rename(at_home)
    named = policy.write(measured(), tmp_path / "named")
    shared = policy.write(measured(for_use=False), tmp_path / "shared")
    absent = tmp_path / "absent.json"
    scenarios = [
        ["absent", {policy.ENV_VAR: str(absent), "HOME": str(home)}, [2, 4, 8], TOKENS],
        ["named", {policy.ENV_VAR: str(named), "HOME": str(tmp_path)}, [2, 4, 8], TOKENS],
        ["default place", {"HOME": str(home)}, [2, 8], TOKENS],
        ["not for use", {policy.ENV_VAR: str(shared), "HOME": str(home)}, [2, 8], TOKENS]]
    got = run_cases(sites, plugin=True, scenarios=scenarios)

    def backends(name: str) -> dict[str, Any]:
        return {tp: c["backend"] for tp, c in got[name]["tp"].items()}

    every = dict.fromkeys(map(str, TOKENS), True)
    # no policy: today's decision (TP2 only, no cap), and the line says why
    assert backends("absent") == {"2": "auto", "4": None, "8": None}
    assert got["absent"]["tp"]["2"]["fused"] == every
    assert f"default rule: no policy at {absent}" in got["absent"]["tp"]["2"]["line"]
    # the policy: TP8 auto-enabled (today's rule would not), TP4 not (NCCL beat it at 1)
    assert backends("named") == {"2": "auto", "4": None, "8": "auto"}
    tp2 = got["named"]["tp"]["2"]
    assert tp2["fused"] == {"1": True, "64": True, "65": False, "128": False, "129": False}
    assert tp2["line"].endswith(f"policy {named} (measured 2026-12-01T20:00:00+00:00 on "
                                "RTX PRO 6000 x8): the fused path won for 1-64 tokens")
    assert got["named"]["tp"]["4"]["fused"] == dict.fromkeys(map(str, TOKENS), False)
    assert "a measured method beat the fused path at TP4" in got["named"]["tp"]["4"]["line"]
    assert got["named"]["tp"]["8"]["fused"] == {"1": True, "64": True, "65": True,
                                                "128": True, "129": False}  # not measured
    # no variable: the default place, the one the plugin's doctor looks at too
    assert got["default place"]["doctor_looks_at"] == str(at_home)
    assert backends("default place") == {"2": "auto", "8": "auto"}
    assert f"policy {at_home} (measured" in got["default place"]["tp"]["8"]["line"]
    assert got["default place"]["tp"]["2"]["fused"]["65"] is False
    # made on a shared GPU: ignored, today's decision, and the line says so
    assert backends("not for use") == {"2": "auto", "8": None}
    assert got["not for use"]["tp"]["2"]["fused"] == every
    assert f"policy {shared} is marked not for use" in got["not for use"]["tp"]["2"]["line"]
    # the patched install decides the same (the plugin's hooks are the series' functions)
    assert run_cases(sites, plugin=False, scenarios=scenarios) == got
