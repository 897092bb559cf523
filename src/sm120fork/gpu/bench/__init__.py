"""The bench harness (``bench``, and ``tune`` per TP size): every all-reduce + RMSNorm
method checked against the fp32 reference, then timed (:mod:`.run`)."""
