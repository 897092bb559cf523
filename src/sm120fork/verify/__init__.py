"""Verify: what each patch does, checked in the artifact we ship."""
