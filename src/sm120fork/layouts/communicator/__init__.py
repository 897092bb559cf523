"""Layout ``communicator`` (SGLang 0.5.10): the fused-norm gate is
``sglang.srt.layers.communicator.apply_flashinfer_allreduce_fusion``, server settings are a
``ServerArgs`` set with ``set_global_server_args_for_scheduler``, and the TP groups are
module globals of ``distributed.parallel_state``.
"""
