"""The SM12x compile proof: FlashInfer's trtllm comm module, compiled and inspected.

No SM120 GPU is at hand, so the proof is made of what the compiler produces:

1. :mod:`.gate`: the tree's own ``gen_trtllm_comm_module()`` runs for one architecture
   and either returns the JIT's sources and nvcc command lines or refuses, verbatim.
2. :mod:`.nvcc`: every source is compiled exactly as the JIT would (its flags), one cubin
   per architecture, cached under a content hash; for the architecture SM12x users run
   (``sm_120f``) the host object is kept too.
3. :mod:`.cubin`: kernels and their SASS sizes from the cubins' ELF sections, PDL
   instructions from the disassembly, CUDA runtime calls from the host objects' symbols.
4. :mod:`.verdict`: results, a verdict per variant and architecture; :mod:`.markdown`
   renders them; :mod:`.run` drives it all; :mod:`.patches` turns it (and the other
   evidence each patch header names) into one verdict per patch; :mod:`.report` writes
   the record ``reports/<stack>/verify-sm120/`` (the full report stays in ``.forks/``).
"""
