"""What the GPU harnesses share: the FlashInfer builds under test and their module build,
the rank processes' common state and the case matrix, multicast safety, the typed run
documents, the records and a stack's wheels.

A harness (:mod:`sm120fork.gpu.ab`, :mod:`sm120fork.gpu.bench`, :mod:`sm120fork.gpu.layer`,
:mod:`sm120fork.gpu.upstream_tests`) imports this package; this package imports no harness
(an import contract in ``pyproject.toml``).
"""
