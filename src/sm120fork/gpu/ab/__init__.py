"""The A/B correctness harness (``test``): FlashInfer's fused all-reduce over the case
matrix, each variant (patched, unpatched, ...) in its own rank groups, compared case by
case; rank side :mod:`.correctness` (:mod:`.worker`), groups :mod:`.launcher`, the run
:mod:`.run`, its report :mod:`.report`.  Shared parts are :mod:`sm120fork.gpu.core`."""
