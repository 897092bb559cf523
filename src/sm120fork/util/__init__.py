"""Small shared helpers: the subprocess/git wrapper, file digests and writes, JSON, tables."""
