"""Keeping the fork alive: :mod:`.status` and :mod:`.bump` (``refresh`` lives with the series).

Nothing here prints: results are dataclasses that the command line renders.
"""
