"""What SGLang would decide about the fused all-reduce at ``--tp 2/4/8`` on this box.

Runs in its own interpreter (``python -m <package>.doctor.decide``): it loads SGLang's
plugins as the server does (so our plugin applies if installed), then calls the
installed SGLang's own auto-enable pass, ``arg_groups.overrides.
_flashinfer_allreduce_fusion_auto_enable``, on this box's real platform, for one of the
model architectures upstream auto-enables the fusion for.  Only the model configuration
and the data-parallel-attention query are fixed inputs, not SGLang's decision code.  The
log lines the pass writes are the policy lines that decided.  Prints one JSON line.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import Any

MODEL_ARCH = "Qwen3MoeForCausalLM"
TP_SIZES = (2, 4, 8)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _view(tp: int) -> Any:
    return types.SimpleNamespace(
        tp_size=tp, nnodes=1, flashinfer_allreduce_fusion_backend=None, attn_cp_size=1,
        encoder_only=False, enable_pdmux=False, disable_custom_all_reduce=False,
        moe_a2a_backend="none")


def decide() -> dict[str, Any]:
    import importlib

    plugins = importlib.import_module("sglang.srt.plugins")
    plugins.load_plugins()
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    config = types.SimpleNamespace(
        hf_config=types.SimpleNamespace(architectures=[MODEL_ARCH], model_type="qwen3_moe",
                                        hidden_size=4096), dtype=None)
    # The decision's inputs, not its code: the model and whether DP attention is on.
    setattr(overrides, "model_config_of", lambda view: config)  # noqa: B010
    setattr(overrides, "attn_dp_enabled_of", lambda view: False)  # noqa: B010
    capture = _Capture()
    logger = logging.getLogger(overrides.__name__)
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    decisions = []
    for tp in TP_SIZES:
        capture.lines.clear()
        try:
            declared = overrides._flashinfer_allreduce_fusion_auto_enable(_view(tp))
        except Exception as exc:
            decisions.append({"tp": tp, "fusion": None,
                              "line": f"{type(exc).__name__}: {exc}"})
            continue
        backend = declared.get("flashinfer_allreduce_fusion_backend")
        line = capture.lines[-1] if capture.lines else (
            "no policy line logged: the installed auto-enable pass did not enable it")
        decisions.append({"tp": tp, "fusion": backend is not None, "backend": backend,
                          "line": line})
    return {"model": MODEL_ARCH, "decisions": decisions}


def main() -> int:
    try:
        result: dict[str, Any] = decide()
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("SM120FORK-DECIDE " + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
