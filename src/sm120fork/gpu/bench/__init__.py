"""The bench harness (``bench``, and ``tune``): every method checked, then timed."""
