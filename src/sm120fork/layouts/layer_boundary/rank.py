"""Layout ``layer_boundary`` in the GPU layer harness's ranks, beside the tree under test."""

from __future__ import annotations

import importlib
from typing import Any

from sm120fork.layouts import Layer

FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
ADD_NORM = "sglang.srt.layers.layer_boundary.residual.add_norm"
#: What the one fallback warning must say (upstream's own words).
WARNING_SAYS = "Disabling flashinfer allreduce fusion permanently"

#: What a rank whose fused call raised alone must say (the series' words).
RAISED_ALONE_SAYS = "peers did not fail with it"


def setup(group: Any) -> Layer:
    """Server args and TP groups on ``group``; autotuning off (the pcie_ipc communicator
    would time its kernels on a GPU the ranks share)."""
    rc = importlib.import_module("sglang.srt.runtime_context")
    rc.get_context().override_server_args(
        flashinfer_allreduce_fusion_backend="trtllm", tp_size=group.world_size,
        disable_flashinfer_autotune=True).install()
    rc.get_parallel().override_permanently(
        tp_size=group.world_size, tp_rank=group.rank, attn_tp_size=group.world_size,
        attn_tp_rank=group.rank, tp_group=group, attn_tp_group=group)
    fusion = importlib.import_module(FUSION_MODULE)
    add_norm: Any = importlib.import_module(ADD_NORM)

    return Layer(
        layout="layer_boundary",
        fusion=fusion,
        layernorm=importlib.import_module("sglang.srt.layers.layernorm"),
        gate=lambda tokens: bool(add_norm.flashinfer_ar_fusion_applies(tokens)),
    )


def patch_gates_in_memory(layer: Layer) -> None:
    """Stock upstream only: its gates accept SM12x, as the G1/G3 patches make them."""
    fusion = layer.fusion
    add_norm: Any = importlib.import_module(ADD_NORM)
    real_resolve = fusion._resolve_backend

    def resolve(backend: str, is_multi_node: bool = False) -> str:
        if backend in ("trtllm", "auto") and not is_multi_node:
            return "trtllm"
        return str(real_resolve(backend, is_multi_node))

    fusion._resolve_backend = resolve
    add_norm._is_sm90_supported = True


def use_fake_flashinfer(fusion: Any, create: Any) -> None:
    """The CPU stand-in bound as this module's import would bind FlashInfer, with a
    cuMemCreate preflight that succeeds (the vote over the ranks stays SGLang's)."""
    fusion._create_allreduce_fusion_workspace = create
    fusion._flashinfer_create_workspace_supports_comm_backend = True
    fusion._flashinfer_create_workspace_supports_group = True
    fusion.get_cuda_driver_bindings = lambda: None
    fusion._make_flashinfer_workspace_allocation_prop = lambda driver: None
    fusion._flashinfer_trtllm_workspace_allocation_sizes = lambda *args: [1 << 21]
    fusion._probe_cumem_create_sequence = lambda *args: True
