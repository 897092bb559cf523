"""Layout ``communicator`` in the GPU layer harness's ranks, beside the tree under test."""

from __future__ import annotations

import importlib
from typing import Any

from sm120fork.layouts import Layer, defaults

FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
#: What the one fallback warning must say: S4's own words (this layout's series).
WARNING_SAYS = "unfused path"

#: What a rank whose fused call raised alone must say (the series' words).
RAISED_ALONE_SAYS = "peers did not fail with it"


def setup(group: Any) -> Layer:
    ps = importlib.import_module("sglang.srt.distributed.parallel_state")
    for name in ("_TP", "_ATTN_TP", "_MOE_TP"):
        setattr(ps, name, group)
    sa = importlib.import_module("sglang.srt.server_args")
    args = defaults(sa.ServerArgs)
    args.tp_size = group.world_size
    args.enable_flashinfer_allreduce_fusion = True
    sa.set_global_server_args_for_scheduler(args)
    fusion = importlib.import_module(FUSION_MODULE)
    communicator = importlib.import_module("sglang.srt.layers.communicator")
    return Layer(
        layout="communicator",
        fusion=fusion,
        layernorm=importlib.import_module("sglang.srt.layers.layernorm"),
        gate=lambda tokens: bool(communicator.apply_flashinfer_allreduce_fusion(tokens)),
    )


def patch_gates_in_memory(layer: Layer) -> None:
    raise ValueError("layout communicator has no in-memory gate patch: run a patched tree")
