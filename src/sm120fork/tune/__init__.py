"""``tune``: measure the owner's box and install the all-reduce policy SGLang follows, with
a record (``reports/<stack>/policy/``) to send us; :mod:`.run` is the library (its bench and
doctor are parameters, so every path is a CPU test), :mod:`.cli` parses and prints."""
