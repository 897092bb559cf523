"""Package: a patched fork tree -> a checked wheel; a whole stack; publishing it (not
``build``: that is pypa/build, which this stage runs)."""
