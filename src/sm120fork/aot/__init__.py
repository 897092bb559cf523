"""Prebuilt (ahead-of-time) FlashInfer trtllm comm modules, shipped as a wheel: compiled
with FlashInfer's own JIT spec and ninja (:mod:`.compile`), checked against sm_90a
(:mod:`.check`), laid out where FlashInfer looks for prebuilt modules (:mod:`.wheel`)."""
