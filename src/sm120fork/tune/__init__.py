"""``tune``: measure the owner's box and install the all-reduce policy SGLang follows.

The doctor says which TP sizes the box can run, the bench measures each, the policy
(:mod:`sm120fork.gpu.policy`) is derived from what finished and installed where SGLang
reads it, and one record (``reports/<stack>/policy/``) is written to send us.
:mod:`.run` is the library (its bench and doctor are parameters, so every path is a CPU
test); :mod:`.cli` parses and prints.
"""
