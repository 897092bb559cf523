"""The offline GPU kit: :mod:`.build` writes it here, :mod:`.boot` runs it on the box."""
