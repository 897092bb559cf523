"""Keeping the fork alive: status, bump, watch and refresh; results are dataclasses the
command line renders (nothing here prints)."""
