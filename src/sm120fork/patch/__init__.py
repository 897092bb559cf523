"""Patch: the series and its headers, applying it, fork work trees, refresh; the one
"already upstream" fingerprint matcher (:mod:`.upstream_match`)."""
