"""Patch: the series and its headers, applying it, fork work trees, refresh."""
