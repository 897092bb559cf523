"""The SM12x compile proof: FlashInfer's trtllm comm module gated (:mod:`.gate`), compiled
with the JIT's own flags (:mod:`.nvcc`) and inspected, judged per variant and architecture
(:mod:`.verdict`), driven by :mod:`.run`; :mod:`.patches` and :mod:`.stack` turn it and the
other evidence into one verdict per patch, :mod:`.report` into the record.
"""
