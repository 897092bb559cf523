"""Verify: the evidence each patch's ``Verified-By`` header names, made from the stack."""

from __future__ import annotations


def require_compiler() -> None:
    """The compile proof's nvcc is on this machine (the CLI may not import cuda/)."""
    from sm120fork.cuda.toolkit import require_nvcc

    require_nvcc()
