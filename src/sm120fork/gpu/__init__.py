"""GPU correctness (``test``) and throughput (``bench``) of FlashInfer's fused all-reduce.

Ranks are separate processes started by :mod:`sm120fork.gpu.launcher`; each runs
:mod:`sm120fork.gpu.worker`.  Everything here except ``worker`` imports without a GPU
(and without FlashInfer) so that the case matrix, the reference math, the tolerances,
the watchdog and the report rendering are unit-tested on CPU machines.

This subpackage deliberately does not import :mod:`sm120fork.util.proc`: the GPU machines
these commands run on have torch and nvcc but not necessarily GitPython, and the
launcher needs streaming, killable process groups rather than run-to-completion calls.
"""

from __future__ import annotations
