"""The A/B correctness harness (``test``): each variant over the case matrix."""
