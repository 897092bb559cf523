"""Package: a patched fork tree -> a checked wheel; a whole stack; publishing it.

Named for the stage (packaging the patched trees), not ``build``: that is pypa/build,
which this stage runs, and tools take a ``build/`` folder for build output.
"""
