"""Prebuilt (ahead-of-time) FlashInfer trtllm comm modules, shipped as a wheel.

From the package index alone an SM12x user has no prebuilt ``trtllm_comm`` module, so the
first fused all-reduce JIT-compiles it (a CUDA toolkit and minutes per machine).  This
package compiles that module from a stack's FlashInfer tree with FlashInfer's own JIT
spec and ninja generation (:mod:`.compile`), for the architectures FlashInfer's own
compilation context picks (:mod:`.targets`), checks every architecture's kernels against
sm_90a (:mod:`.inspect`) and lays the result out as a wheel where that FlashInfer looks
for prebuilt modules at run time (:mod:`.wheel`).
"""
