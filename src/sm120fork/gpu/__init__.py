"""GPU correctness (``test``) and throughput (``bench``) of FlashInfer's fused all-reduce.

Ranks are separate processes started by :mod:`sm120fork.gpu.launcher`; each runs
:mod:`sm120fork.gpu.worker`.  Everything here except ``worker`` imports without a GPU
(and without FlashInfer) so that the case matrix, the reference math, the tolerances,
the watchdog and the report rendering are unit-tested on CPU machines.

The GPU machines have torch and nvcc but not the toolkit's CLI dependencies: this
subpackage imports only the stdlib base (errors, entry, util.proc, cuda/, harness/), never
cli/ (its entry point is :mod:`sm120fork.gpu.cli`) and never rich or git.
"""

from __future__ import annotations
