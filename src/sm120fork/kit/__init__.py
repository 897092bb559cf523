"""The offline GPU kit: one folder that runs the GPU harnesses on a box with no network.

:mod:`.build` writes it here; :mod:`.boot` (standard library only, copied into the kit)
runs it there.
"""
