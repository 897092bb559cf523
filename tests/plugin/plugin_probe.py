"""Behaviour cases of sglang 0.5.23's SM12x gates, run in a fresh interpreter.

``python plugin_probe.py <site> <major.minor> [--load-plugins] [--second-plugin]``:
``<site>`` holds an installed sglang (stock or patched) and, for the plugin run, the
installed plugin wheel.
Only the GPU query is faked (``sm120fork.harness.fake_gpu.fake_gpu``, which also stubs the
GPU-only packages), and ``sglang/__init__.py`` is not run (it imports the whole server;
the modules under test are imported for real).  With ``--load-plugins`` SGLang's own
``load_plugins()`` runs first, as in every SGLang process.  Where a gate reads process
state (the exec config, DP attention), the case sets that input on the module under test.
With ``--second-plugin`` a second plugin (``zz_probe_plugin``, loaded after ours) has
AROUND hooks on G1's target and on another function; what they recorded is reported.
Prints one line ``PLUGIN-PROBE <json>``: {"plugin": [log lines], "cases": {name: result},
"second_plugin": [targets called]}.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import types
from typing import Any


def _result(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return {"value": fn(*args, **kwargs)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> int:
    site, capability = sys.argv[1], tuple(int(x) for x in sys.argv[2].split("."))
    load = "--load-plugins" in sys.argv[3:]
    sys.path.insert(0, site)
    from sm120fork.harness.fake_gpu import fake_gpu

    fake_gpu((capability[0], capability[1]))
    package = types.ModuleType("sglang")
    package.__path__ = [os.path.join(site, "sglang")]
    sys.modules["sglang"] = package
    plugin_lines = _Lines()
    logging.getLogger("sm120fork.plugin").addHandler(plugin_lines)
    logging.getLogger("sm120fork.plugin").setLevel(logging.INFO)
    if load:
        importlib.import_module("sglang.srt.plugins").load_plugins()

    fusion: Any = importlib.import_module("sglang.srt.layers.flashinfer_comm_fusion")
    overrides: Any = importlib.import_module("sglang.srt.arg_groups.overrides")
    model_hook: Any = importlib.import_module("sglang.srt.arg_groups.model_hook")
    add_norm: Any = importlib.import_module("sglang.srt.layers.layer_boundary.residual.add_norm")
    cases: dict[str, Any] = {}
    for backend in ("auto", "trtllm", "mnnvl", "cutedsl"):
        for multi in (False, True):
            cases[f"G1 _resolve_backend({backend}, multi_node={multi})"] = _result(
                fusion._resolve_backend, backend, multi)

    config = types.SimpleNamespace(hf_config=types.SimpleNamespace(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=4096),
        dtype=None)
    overrides.model_config_of = lambda view: config
    overrides.attn_dp_enabled_of = lambda view: False
    env = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
    for value in (None, "0", "1", "maybe"):
        for tp in (1, 2, 4, 8):
            view = types.SimpleNamespace(
                tp_size=tp, nnodes=1, flashinfer_allreduce_fusion_backend=None,
                attn_cp_size=1, encoder_only=False, enable_pdmux=False,
                disable_custom_all_reduce=False, moe_a2a_backend="none")
            os.environ.pop(env, None)
            if value is not None:
                os.environ[env] = value
            # through the name model_hook took with ``from overrides import ...``
            cases[f"G2 auto-enable tp{tp} {env}={value}"] = _result(
                model_hook._flashinfer_allreduce_fusion_auto_enable, view)
    os.environ.pop(env, None)

    add_norm.is_dp_attention_enabled = lambda: False
    fused_backend: str | None
    for fused_backend in ("trtllm", None):
        bag = types.SimpleNamespace(comm=types.SimpleNamespace(
            flashinfer_allreduce_fusion_backend=fused_backend))
        add_norm.get_exec = lambda bag=bag: bag
        add_norm.uses_cutedsl_ar_fusion = lambda: False
        add_norm.is_flashinfer_allreduce_unavailable = lambda: False
        for batch in (16, 4096):
            cases[f"G3 flashinfer_ar_fusion_applies({batch}) backend={fused_backend}"] = _result(
                add_norm.flashinfer_ar_fusion_applies, batch)
    second: list[str] = []
    if "--second-plugin" in sys.argv[3:]:  # its AROUND hooks record each call they wrap
        fusion.is_flashinfer_allreduce_unavailable()
        second = list(importlib.import_module("zz_probe_plugin").CALLS)
    sys.stdout.write("PLUGIN-PROBE " + json.dumps(
        {"plugin": plugin_lines.lines, "cases": cases, "second_plugin": second},
        sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
