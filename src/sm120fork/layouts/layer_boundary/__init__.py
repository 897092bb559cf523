"""Layout ``layer_boundary`` (SGLang 0.5.23): the fused-norm gate is
``sglang.srt.layers.layer_boundary.residual.add_norm.flashinfer_ar_fusion_applies``,
server settings and TP groups live in ``sglang.srt.runtime_context``, and the backend is
resolved by ``flashinfer_comm_fusion._resolve_backend``.
"""
