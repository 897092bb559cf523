"""Preparing upstream submissions: :mod:`.evidence` gathers and checks, :mod:`.pr` writes."""
