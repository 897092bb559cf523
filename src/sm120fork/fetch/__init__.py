"""Fetch: a pinned upstream source -> a git work tree laid out like the upstream repo."""
