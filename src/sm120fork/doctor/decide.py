"""What the installed SGLang would decide about the fused all-reduce at each ``--tp``.

Runs in its own interpreter (``python -m <package>.doctor.decide 2 4``): loads SGLang's
plugins as the server does, then calls that SGLang's own auto-enable code on this box for
one model that every SGLang here auto-enables the fusion for.  Which code that is depends on
what the SGLang has (arg_groups first, else ServerArgs), not on its version number.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import sys
import types
from collections.abc import Sequence
from typing import Any

from ..util import wire
from .facts import Decision, Decisions

MODEL_ARCH = "Qwen3MoeForCausalLM"
TAG = "DECIDE"  # its one message on the one wire format (util/wire.py)
#: how the all-reduce policy's lines start in SGLang's log (G7 and the plugin): the
#: policy that decided, or the file found and not followed
OUR_PREFIX = "sm120fork "


class _Capture(logging.Handler):
    """What ``logger_name`` logs from now on, at INFO and above."""

    def __init__(self, logger_name: str) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        logger = logging.getLogger(logger_name)
        logger.addHandler(self)
        logger.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class _Config(types.SimpleNamespace):
    """A model configuration: the attributes named, None for the rest."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _model_config() -> _Config:
    hf = _Config(architectures=[MODEL_ARCH], model_type="qwen3_moe", hidden_size=4096)
    return _Config(hf_config=hf, dtype=None, is_multimodal=False, quantization=None)


def _has(module: str, attribute: str) -> bool:
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
    return found and hasattr(importlib.import_module(module), attribute)


def _arg_groups(tp: int) -> tuple[bool | None, str | None, list[str]]:
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    config = _model_config()
    # The decision's inputs, not its code: the model and whether DP attention is on.
    setattr(overrides, "model_config_of", lambda view: config)  # noqa: B010
    setattr(overrides, "attn_dp_enabled_of", lambda view: False)  # noqa: B010
    capture = _Capture(overrides.__name__)
    view = types.SimpleNamespace(
        tp_size=tp, nnodes=1, flashinfer_allreduce_fusion_backend=None, attn_cp_size=1,
        encoder_only=False, enable_pdmux=False, disable_custom_all_reduce=False,
        moe_a2a_backend="none")
    declared = overrides._flashinfer_allreduce_fusion_auto_enable(view)
    backend = declared.get("flashinfer_allreduce_fusion_backend")
    return backend is not None, backend, capture.lines


def _server_args(tp: int) -> tuple[bool | None, str | None, list[str]]:
    module = importlib.import_module("sglang.srt.server_args")
    cls = module.ServerArgs
    args = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    args.model_path = "sm120fork-doctor-model"
    args.tp_size = tp
    args.model_config = _model_config()     # what get_model_config() returns
    capture = _Capture(module.__name__)
    args._handle_model_specific_adjustments()
    enabled = bool(args.enable_flashinfer_allreduce_fusion)
    return enabled, "trtllm" if enabled else None, capture.lines


def decide(tp_sizes: Sequence[int]) -> Decisions:
    plugins_loaded = False
    if importlib.util.find_spec("sglang.srt.plugins") is not None:
        importlib.import_module("sglang.srt.plugins").load_plugins()
        plugins_loaded = True
    if _has("sglang.srt.arg_groups.overrides", "_flashinfer_allreduce_fusion_auto_enable"):
        source, decide_at = "arg_groups", _arg_groups
    elif _has("sglang.srt.server_args", "ServerArgs"):
        source, decide_at = "server_args", _server_args
    else:
        return {"error": "this SGLang has neither arg_groups.overrides nor ServerArgs"}
    decisions: list[Decision] = []
    for tp in tp_sizes:
        try:
            fusion, backend, lines = decide_at(tp)
        except Exception as exc:
            decisions.append({"tp": tp, "fusion": None, "backend": None,
                              "line": f"{type(exc).__name__}: {exc}"})
            continue
        ours = [x for x in lines if x.startswith(OUR_PREFIX)]
        relevant = [x for x in lines if "usion" in x and x not in ours] or [
            x for x in lines if x not in ours]
        line = relevant[-1] if relevant else (
            "no policy line logged: SGLang's auto-enable code did not enable it")
        decisions.append({"tp": tp, "fusion": fusion, "backend": backend, "line": line,
                          "policy_lines": ours})
    return {"model": MODEL_ARCH, "source": source, "plugins_loaded": plugins_loaded,
            "decisions": decisions}


def main(argv: Sequence[str]) -> int:
    try:
        result = decide([int(x) for x in argv])
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    wire.say(TAG, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
