"""Patch: the series and its headers (with the one "already upstream" fingerprint matcher),
applying it, fork work trees, refresh."""
