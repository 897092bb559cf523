"""Index: every stack's built wheels as a static package index pip installs from."""
