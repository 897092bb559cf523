"""Verify: what each patch does, checked in the artifact we ship; the one "already
upstream" matcher (:mod:`.upstream_match`)."""
