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
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sm120fork.gpu import policy
from sm120fork.plugin import build as plugin_build

from helpers_sglang import ROOT, Sites

pytestmark = [pytest.mark.network, pytest.mark.slow]

TOKENS = (1, 64, 65, 128, 129)

#: both probes: every log line SGLang (and the plugin) writes is kept, then the plugins load
CAPTURE = textwrap.dedent("""\
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
""")

#: both probes: SGLang's model config, DP attention and executor flags, stubbed (``config``
#: is the probe's own), and G2's start-up decision at a TP size
STUBS = textwrap.dedent("""\
    overrides.model_config_of = lambda view: config
    overrides.attn_dp_enabled_of = lambda view: False
    bag = types.SimpleNamespace(comm=types.SimpleNamespace(
        flashinfer_allreduce_fusion_backend="trtllm"))
    add_norm.is_dp_attention_enabled = lambda: False
    add_norm.get_exec = lambda: bag
    add_norm.uses_cutedsl_ar_fusion = lambda: False
    add_norm.is_flashinfer_allreduce_unavailable = lambda: False

    def auto_enable(tp):  # G2's start-up decision at TP ``tp``; the log starts afresh
        view = types.SimpleNamespace(
            tp_size=tp, nnodes=1, flashinfer_allreduce_fusion_backend=None,
            attn_cp_size=1, encoder_only=False, enable_pdmux=False,
            disable_custom_all_reduce=False, moe_a2a_backend="none")
        del lines.lines[:]
        return model_hook._flashinfer_allreduce_fusion_auto_enable(view).get(
            "flashinfer_allreduce_fusion_backend")
""")

PROBE = textwrap.dedent("""\
    import importlib, json, logging, os, sys, types
    site, scenarios, load = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "plugin"
    sys.path.insert(0, site)
    from sm120fork.harness.fake_gpu import fake_gpu
    fake_gpu((12, 0))
    package = types.ModuleType("sglang")
    package.__path__ = [os.path.join(site, "sglang")]
    sys.modules["sglang"] = package

    # CAPTURE
    reader = importlib.import_module(
        "sm120fork_sglang_plugin.gpu.policy" if load else "sm120fork.gpu.policy")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    model_hook = importlib.import_module("sglang.srt.arg_groups.model_hook")
    add_norm = importlib.import_module("sglang.srt.layers.layer_boundary.residual.add_norm")
    follow = importlib.import_module("sglang.srt.layers.sm120fork_allreduce")
    config = types.SimpleNamespace(hf_config=types.SimpleNamespace(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=4096),
        dtype="torch.bfloat16")
    # STUBS
    gate = add_norm.flashinfer_ar_fusion_applies
    out = {}
    for name, env, tps, tokens in scenarios:
        for key in ("SGLANG_SM120_ALLREDUCE_POLICY", "HOME"):
            os.environ.pop(key, None)
        os.environ.update(env)
        follow.sglang_forget()  # SGLang reads the file once a process
        got = {"doctor_looks_at": str(reader.locate()), "tp": {}}
        for tp in tps:
            backend = auto_enable(tp)
            said = [x for x in lines.lines if "usion" in x]
            decided = [x for x in lines.lines if x.startswith("sm120fork all-reduce")]
            add_norm.get_parallel = lambda tp=tp: types.SimpleNamespace(tp_size=tp)
            fused = {str(n): bool(gate(n)) for n in tokens}
            got["tp"][str(tp)] = {"backend": backend, "line": said[-1] if said else None,
                                  "decision": decided[-1] if decided else None,
                                  "fused": fused}
        out[name] = got
    print("POLICY-PROBE " + json.dumps(out, sort_keys=True))
""").replace("# CAPTURE\n", CAPTURE).replace("# STUBS\n", STUBS)


def _point(method: str, tokens: int, us: float) -> dict[str, Any]:
    return {"kind": "point", "method": method, "tokens": tokens, "hidden": 4096,
            "status": "timed", "median_us": us, "rank_medians_us": [us]}


def measured(*, for_use: bool = True) -> dict[str, Any]:
    """TP2: fused_auto wins 1-64 (nothing measured above); TP4: NCCL beats it at 1 token;
    TP8: fused_auto wins every measured count (1-128)."""
    tp2 = [_point("fused_auto", 1, 5), _point("pcie_ipc_rmsnorm", 1, 8),
           _point("fused_auto", 64, 9), _point("pcie_ipc_rmsnorm", 64, 10)]
    tp4 = [_point("fused_auto", 1, 9), _point("nccl_rmsnorm", 1, 8)]
    tp8 = [_point("fused_auto", t, 6 + t / 32) for t in (1, 64, 128)] + [
        _point("nccl_rmsnorm", t, 40 + t / 8) for t in (1, 64, 128)]
    return policy.derive({2: tp2, 4: tp4, 8: tp8}, for_use=for_use, made={
        "created": "2026-12-01T20:00:00+00:00", "gpu": "RTX PRO 6000", "gpu_count": 8})


def run_cases(sites: Sites, *, plugin: bool, scenarios: list[Any]) -> dict[str, Any]:
    site = sites.stock if plugin else sites.patched
    paths = [str(sites.deps), str(ROOT / "src"), *([str(sites.plugin)] if plugin else [])]
    env = {k: v for k, v in os.environ.items() if k not in (
        policy.ENV_VAR, policy.AUTO_ENV, "SM120FORK_PLUGIN", "SGLANG_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    done = subprocess.run([sites.python, "-c", PROBE, str(site), json.dumps(scenarios),
                           "plugin" if plugin else "patched"], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("POLICY-PROBE ")), None)
    assert line, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(line.removeprefix("POLICY-PROBE "))
    return result


def test_the_plugin_follows_the_policy_and_names_it(sites: Sites, tmp_path: Path) -> None:
    assert "gpu/policy.py" in plugin_build.vendored_files()
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
    assert "TP2 measured faster (sglang #30700/#32330)" in got["absent"]["tp"]["2"]["line"]
    assert got["absent"]["tp"]["2"]["decision"].endswith(
        f"(today's rule: our fused path at TP2 only; no policy at {absent})")
    # the policy: TP8 auto-enabled (today's rule would
    # not), TP4 not (NCCL beat it at 1)
    assert backends("named") == {"2": "auto", "4": None, "8": "auto"}
    tp2 = got["named"]["tp"]["2"]
    assert tp2["fused"] == {"1": True, "64": True, "65": False, "128": False, "129": False}
    assert tp2["line"].endswith("the measured all-reduce policy: fused_auto for 1-64, "
                                "nccl_rmsnorm for 65+ tokens")
    assert tp2["decision"] == (
        "sm120fork all-reduce at TP2: fused_auto for 1-64, nccl_rmsnorm for 65+ tokens "
        f"(policy {named}, measured 2026-12-01T20:00:00+00:00 on RTX PRO 6000 x8)")
    assert got["named"]["tp"]["4"]["fused"] == dict.fromkeys(map(str, TOKENS), False)
    assert "the measured all-reduce policy names no range for it at TP4" in \
        got["named"]["tp"]["4"]["line"]
    assert got["named"]["tp"]["8"]["fused"] == {"1": True, "64": True, "65": True,
                                                "128": True, "129": False}  # not measured
    # no variable: the default place, the one the plugin's doctor looks at too
    assert got["default place"]["doctor_looks_at"] == str(at_home)
    assert backends("default place") == {"2": "auto", "8": "auto"}
    assert f"(policy {at_home}, measured" in got["default place"]["tp"]["8"]["decision"]
    assert got["default place"]["tp"]["2"]["fused"]["65"] is False
    # made on a shared GPU: ignored, today's decision, and the line says so
    assert backends("not for use") == {"2": "auto", "8": None}
    assert got["not for use"]["tp"]["2"]["fused"] == every
    assert f"policy {shared} is marked not for use" in \
        got["not for use"]["tp"]["2"]["decision"]
    # the patched install decides the same (the plugin's hooks are the series' functions)
    assert run_cases(sites, plugin=False, scenarios=scenarios) == got


# --- version 2: a method per token range, followed per batch (issue 33 item 2) -------------

V2_TOKENS = (1, 16, 17, 32, 33, 256, 257)
#: the faked GPU's name (harness/fake_gpu.py): a policy measured on it applies off SM12x too
SM120_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"

V2_PROBE = textwrap.dedent("""\
    import importlib, importlib.machinery, json, logging, os, sys, types
    site, scenarios, load = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "plugin"
    sys.path.insert(0, site)
    from sm120fork.harness.fake_gpu import fake_gpu
    fake_gpu(tuple(json.loads(sys.argv[4])))
    import torch
    package = types.ModuleType("sglang")
    package.__path__ = [os.path.join(site, "sglang")]
    sys.modules["sglang"] = package
    calls = []

    class Runtime:  # b12x's pcie.AllReduce, recording what SGLang asks of it
        @classmethod
        def from_exchange_group(cls, **kw):
            calls.append(["b12x.from_exchange_group", sorted(kw)])
            return cls()
        def plan(self, x, operation):
            return operation
        def all_reduce_fused_add_rms_norm(self, x, res, w, eps, *, plan, out, residual_out):
            calls.append(["b12x.all_reduce_fused_add_rms_norm", plan, x.shape[0]])
            return out, residual_out

    def fake(name, **attrs):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        vars(module).update(attrs)
        return module

    pcie = fake("flashinfer.experimental.b12x.comm.pcie", AllReduce=Runtime)
    comm = fake("flashinfer.experimental.b12x.comm", pcie=pcie)
    b12x = fake("flashinfer.experimental.b12x", comm=comm)
    sys.modules.update({"flashinfer.experimental.b12x": b12x,
                        "flashinfer.experimental.b12x.comm": comm,
                        "flashinfer.experimental.b12x.comm.pcie": pcie})

    # CAPTURE
    follow = importlib.import_module("sglang.srt.layers.sm120fork_allreduce")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    model_hook = importlib.import_module("sglang.srt.arg_groups.model_hook")
    add_norm = importlib.import_module("sglang.srt.layers.layer_boundary.residual.add_norm")
    fcf = importlib.import_module("sglang.srt.layers.flashinfer_comm_fusion")
    pcie_ar = importlib.import_module(
        "sglang.srt.distributed.device_communicators.pcie_ipc_ar")
    parallel_state = importlib.import_module("sglang.srt.distributed.parallel_state")
    config = types.SimpleNamespace(hf_config=types.SimpleNamespace(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=4096),
        dtype=torch.bfloat16)
    # STUBS
    layernorm = importlib.import_module("sglang.srt.layers.layernorm")
    distributed = importlib.import_module("sglang.srt.distributed")

    def fused(**kw):  # SGLang's entry to our fused path: record it, then decline
        calls.append(["fused.flashinfer_allreduce_residual_rmsnorm"])
        return None, None

    def all_reduce(x):
        calls.append(["unfused.all_reduce"])
        return x

    fcf.flashinfer_allreduce_residual_rmsnorm = fused
    distributed.attention_tensor_model_parallel_all_reduce = all_reduce
    norm = types.SimpleNamespace(variance_epsilon=1e-6, forward=lambda x, r, p: (
        calls.append(["norm.forward"]), (x, r))[1])

    class Workspace:  # FlashInfer's pcie_ipc workspace behind SGLang's communicator
        def supports(self, x):
            return True

    out = {}
    for name, env, tps, hidden in scenarios:
        for key in ("SGLANG_SM120_ALLREDUCE_POLICY", "HOME", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"):
            os.environ.pop(key, None)
        os.environ.update(env)
        if hidden:  # the module a method needs does not import here
            sys.modules[hidden] = None
        follow.sglang_forget()
        got = {}
        for tp in tps:
            backend = auto_enable(tp)
            said = [x.removeprefix("sm120fork ") for x in lines.lines
                    if x.startswith("sm120fork all-reduce") or "cannot run here" in x]
            add_norm.get_parallel = lambda tp=tp: types.SimpleNamespace(tp_size=tp)
            layernorm.get_parallel = lambda tp=tp: types.SimpleNamespace(attn_tp_size=tp)
            fcf.resolve_fusion_group = lambda use_attn_tp_group, tp=tp: (
                tp, 0, types.SimpleNamespace(device_group="tp-group"))
            eligible = pcie_ar.eligible_group(group_name="tp", world_size=tp,
                                              deterministic=False)
            communicator = object.__new__(pcie_ar.PcieIpcCommunicator)
            communicator.__dict__.update(disabled=False, _world_size=tp, max_numel=1 << 30,
                                         _workspace=Workspace())
            communicator._ensure_workspace = lambda x: True
            group = types.SimpleNamespace(
                world_size=tp, pymscclpp_comm=None, qr_comm=None,
                torch_symm_mem_comm=None, pynccl_comm=None,
                ca_comm=types.SimpleNamespace(disabled=False,
                                              should_custom_ar=lambda x: True),
                pcie_ipc_comm=communicator if eligible else None)
            per_batch = {}
            for n in json.loads(sys.argv[5]):
                x = torch.zeros(n, 64, dtype=torch.bfloat16)
                del calls[:]
                applies = bool(add_norm.flashinfer_ar_fusion_applies(n))
                ran = []
                if applies:  # the fused site: the norm's all-reduce fusion
                    layernorm._forward_with_allreduce_fusion(
                        norm, x, torch.zeros_like(x), None,
                        torch.ones(64, dtype=torch.bfloat16), True)
                    ran = [c[0] for c in calls]
                unfused = parallel_state.GroupCoordinator._resolve_outplace_all_reduce_method(
                    group, x)
                per_batch[str(n)] = {"fused_site": applies, "ran": ran,
                                     "unfused": unfused if not applies else None}
            got[str(tp)] = {"backend": backend, "said": said, "pcie_ipc_built": eligible,
                            "batches": per_batch}
        out[name] = got
    print("POLICY-PROBE " + json.dumps(out, sort_keys=True))
""").replace("# CAPTURE\n", CAPTURE).replace("# STUBS\n", STUBS)


def v2_policy(*, gpu: str = SM120_NAME, for_use: bool = True) -> dict[str, Any]:
    """TP2: our fused path for 1-16 tokens, b12x 17-32, pcie_ipc 33-256; TP8: ours 1-64;
    TP4: NCCL (SGLang's own dispatch) 1-64."""
    return {
        "format": "sm120fork-allreduce-policy", "version": 2, "for_use": for_use,
        "made": {"created": "2026-12-03T20:00:00+00:00", "gpu": gpu, "gpu_count": 8},
        "tp": {"2": {"ranges": [
            {"min_tokens": 1, "max_tokens": 16, "method": "fused_auto",
             "fallback": ["nccl_rmsnorm"]},
            {"min_tokens": 17, "max_tokens": 32, "method": "b12x_fused",
             "fallback": ["pcie_ipc_rmsnorm", "nccl_rmsnorm"]},
            {"min_tokens": 33, "max_tokens": 256, "method": "pcie_ipc_rmsnorm",
             "fallback": ["nccl_rmsnorm"]}]},
            "4": {"ranges": [{"min_tokens": 1, "max_tokens": 64, "method": "nccl_rmsnorm",
                              "fallback": []}]},
            "8": {"ranges": [{"min_tokens": 1, "max_tokens": 64, "method": "fused_auto",
                              "fallback": ["nccl_rmsnorm"]}]}}}


def run_v2(sites: Sites, *, plugin: bool, scenarios: list[Any],
           capability: tuple[int, int] = (12, 0)) -> dict[str, Any]:
    site = sites.stock if plugin else sites.patched
    paths = [str(sites.deps), str(ROOT / "src"), *([str(sites.plugin)] if plugin else [])]
    env = {k: v for k, v in os.environ.items() if k not in (
        policy.ENV_VAR, policy.AUTO_ENV, "SM120FORK_PLUGIN", "SGLANG_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    done = subprocess.run([sites.python, "-c", V2_PROBE, str(site), json.dumps(scenarios),
                           "plugin" if plugin else "patched", json.dumps(capability),
                           json.dumps(V2_TOKENS)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("POLICY-PROBE ")), None)
    assert line, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(line.removeprefix("POLICY-PROBE "))
    return result


def _write(doc: dict[str, Any], path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def test_sglang_follows_a_v2_policy_per_token_range(sites: Sites, tmp_path: Path) -> None:
    """Each batch runs the route decision.route_for names, through the functions SGLang
    calls, on the patched install and on stock + plugin alike; the start-up line is the
    decision's own (the doctor's, too); a missing module falls back with one line; no
    policy: today's decision."""
    from sm120fork.gpu import decision

    named = _write(v2_policy(), tmp_path / "v2.json")
    absent = str(tmp_path / "absent.json")
    scenarios = [["v2", {policy.ENV_VAR: named}, [2, 4, 8], None],
                 ["no b12x", {policy.ENV_VAR: named}, [2], "flashinfer.experimental.b12x"],
                 ["absent", {policy.ENV_VAR: absent}, [2, 4], None]]
    got = run_v2(sites, plugin=True, scenarios=scenarios)
    made = decision.decide(policy.validate(v2_policy(), named),
                           decision.Process(world_size=2, gpu_major=12),
                           source=f"policy {named}, measured 2026-12-03T20:00:00+00:00 on "
                                  f"{SM120_NAME} x8")
    tp2 = got["v2"]["2"]
    assert tp2["backend"] == "auto"
    assert tp2["said"] == [made.line]
    assert made.line.startswith("all-reduce at TP2: fused_auto for 1-16, b12x_fused for "
                                "17-32, pcie_ipc_rmsnorm for 33-256, nccl_rmsnorm for 257+")
    # the doctor says the same line for this environment
    seen = decision.view(policy.read_for_doctor({policy.ENV_VAR: named}), [2],
                         gpu_major=12, gpu_name=SM120_NAME)
    assert seen["lines"][0] == made.line
    expect_route = {n: made.route_for(n) for n in V2_TOKENS}
    assert expect_route == {1: "fused", 16: "fused", 17: "b12x", 32: "b12x",
                            33: "pcie_ipc", 256: "pcie_ipc", 257: "sglang_dispatch"}
    ran = {"fused": ["fused.flashinfer_allreduce_residual_rmsnorm", "unfused.all_reduce",
                     "norm.forward"],
           "b12x": ["b12x.from_exchange_group", "b12x.all_reduce_fused_add_rms_norm"]}
    assert tp2["pcie_ipc_built"] is True  # a range names it: the communicator is built
    for n, route in expect_route.items():
        batch = tp2["batches"][str(n)]
        assert batch["fused_site"] == (route in ("fused", "b12x")), (n, batch)
        if route in ran:  # b12x's runtime is made once, on its first batch
            assert batch["ran"] == ran[route][-len(batch["ran"]):], (n, batch)
            assert batch["ran"][-1:] == ran[route][-1:], (n, batch)
        else:  # pcie_ipc only in its ranges (ahead of the custom all-reduce), else SGLang's
            assert batch["unfused"] == ("pcie_ipc" if route == "pcie_ipc" else "ca"), n
    # TP4: SGLang's own dispatch, pcie_ipc not built, no fused path; TP8: ours up to 64
    assert got["v2"]["4"]["backend"] is None
    assert got["v2"]["4"]["pcie_ipc_built"] is False
    assert not any(b["fused_site"] for b in got["v2"]["4"]["batches"].values())
    assert got["v2"]["8"]["backend"] == "auto"
    assert [n for n, b in got["v2"]["8"]["batches"].items() if b["fused_site"]] == [
        "1", "16", "17", "32", "33"]
    # b12x does not import: its range falls back to pcie_ipc, with one line
    nob = got["no b12x"]["2"]
    assert nob["said"][1:] == ["TP2 tokens 17-32: b12x_fused cannot run here "
                               "(flashinfer.experimental.b12x does not import here); "
                               "falling back to pcie_ipc_rmsnorm"]
    assert nob["batches"]["17"]["fused_site"] is False
    assert nob["batches"]["17"]["unfused"] == "pcie_ipc"
    # no policy: today's decision, unchanged (TP2 fused for every batch, no pcie_ipc)
    assert got["absent"]["2"]["backend"] == "auto"
    assert got["absent"]["4"]["backend"] is None
    assert all(b["fused_site"] for b in got["absent"]["2"]["batches"].values())
    assert got["absent"]["2"]["pcie_ipc_built"] is False
    assert got["absent"]["2"]["said"][0].endswith(f"no policy at {absent})")
    # the patched install decides the same (the plugin's hooks are the series' code)
    assert run_v2(sites, plugin=False, scenarios=scenarios) == got


def test_a_policy_is_followed_off_sm12x_only_on_its_own_gpu(sites: Sites,
                                                            tmp_path: Path) -> None:
    """On an H200 (SM90) a policy measured on an H200 is followed; one measured elsewhere,
    or none, leaves upstream's SM90 decision exactly (fused auto-enabled, every batch)."""
    h200 = _write(v2_policy(gpu="NVIDIA H200"), tmp_path / "h200.json")
    other = _write(v2_policy(), tmp_path / "other.json")
    absent = str(tmp_path / "absent.json")
    scenarios = [["h200", {policy.ENV_VAR: h200}, [2, 4], None],
                 ["other", {policy.ENV_VAR: other}, [2, 4], None],
                 ["absent", {policy.ENV_VAR: absent}, [2, 4], None]]
    got = run_v2(sites, plugin=False, scenarios=scenarios, capability=(9, 0))
    assert got["h200"]["4"]["backend"] is None  # the policy names no fused range at TP4
    assert got["h200"]["2"]["batches"]["33"]["unfused"] == "pcie_ipc"
    assert got["h200"]["2"]["said"][0].startswith("all-reduce at TP2: fused_auto for 1-16")
    # b12x needs SM12x: its range falls back to pcie_ipc on the H200, with one line
    assert "b12x_fused cannot run here (it runs on SM12x only" in got["h200"]["2"]["said"][1]
    # a policy measured elsewhere is named in one line with why; none: nothing is said
    assert [x.split(" (policy ")[0] for x in got["other"]["2"]["said"]] == [
        "all-reduce at TP2: SGLang's own code, as upstream"]
    assert "off SM12x a policy is followed only on the GPU model" in \
        got["other"]["2"]["said"][0]
    assert got["absent"]["2"]["said"] == []
    for name in ("other", "absent"):
        assert got[name]["4"]["backend"] == "auto", name  # upstream's SM90 rule
        assert got[name]["2"]["pcie_ipc_built"] is False, name
        assert all(b["fused_site"] for b in got[name]["4"]["batches"].values()), name
    assert run_v2(sites, plugin=True, scenarios=scenarios, capability=(9, 0)) == got
