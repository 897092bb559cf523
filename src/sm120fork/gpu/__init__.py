"""The GPU harnesses: FlashInfer's fused all-reduce A/B (``test``, :mod:`.ab`) and bench
(``bench``, :mod:`.bench`), SGLang's own layer path (``sglang-layer``, :mod:`.layer`) and an
upstream PR's own GPU tests (``upstream-tests``, :mod:`.upstream_tests`), over one shared
core (:mod:`.core`); :mod:`.cli` parses and prints, and the all-reduce policy
(:mod:`.methods`, :mod:`.policy`, :mod:`.decision`) is bundled into SGLang and the plugin.

Ranks are separate processes, each harness's own (``python -m sm120fork.gpu.ab.worker``,
``...bench.worker``, ``...layer.rank``).  Everything except the rank side imports without a
GPU (and without FlashInfer) so that the case matrix, the reference math, the tolerances,
the watchdog and the report rendering are unit-tested on CPU machines.

The GPU machines have torch and nvcc but not the toolkit's CLI dependencies: this
subpackage imports only the stdlib base (errors, entry, util.proc, cuda/, harness/), never
cli/ (its entry point is :mod:`sm120fork.gpu.cli`) and never rich or git.
"""

from __future__ import annotations
