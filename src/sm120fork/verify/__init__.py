"""Verify: the evidence each patch's ``Verified-By`` header names, made from the stack."""

from __future__ import annotations


def require_compiler() -> None:
    """The compile proof's nvcc is on this machine (:func:`~sm120fork.cuda.toolkit.locate_nvcc`,
    the locator the proof runs), else a ``ConfigError`` naming where it looked; standard
    library only, so the noxfile asks it before anything is installed."""
    from sm120fork.cuda.toolkit import require_nvcc

    require_nvcc()
