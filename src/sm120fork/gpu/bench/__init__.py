"""The bench harness (``bench``, and ``tune`` per TP size): every all-reduce + RMSNorm
method (:mod:`sm120fork.gpu.methods`) checked against the fp32 reference, then timed; rank
side :mod:`.timing` and :mod:`.adapters` (:mod:`.worker`), groups :mod:`.launcher`, the run
and its policy :mod:`.run`, its report :mod:`.report`; :mod:`.projection` projects the
methods onto a box not at hand.  Shared parts are :mod:`sm120fork.gpu.core`."""
