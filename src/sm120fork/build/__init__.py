"""Build: a patched fork tree -> a checked wheel; a whole stack; publishing it."""
