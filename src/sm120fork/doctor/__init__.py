"""``doctor``: what an SM120 owner runs first on the box that will serve."""

from .cli import main

__all__ = ["main"]
