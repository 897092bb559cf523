"""A hint is a command the user can paste: ``nox -s bump -- ...`` under nox (which sets
``SM120FORK_FRONT_DOOR=nox``), else ``python -m sm120fork bump ...``."""

from __future__ import annotations

import os
import shlex

FRONT_DOOR_ENV = "SM120FORK_FRONT_DOOR"

#: The nox session of each verb whose session name differs (noxfile.py).
_SESSIONS = {"upstream-pr": "upstream_pr", "verify-sm120": "verify_sm120",
             "build-aot": "build_aot", "gpu test": "gpu_test", "gpu bench": "bench",
             "gpu sglang-layer": "sglang_layer", "gpu-kit": "gpu_kit"}


def via_nox() -> bool:
    return os.environ.get(FRONT_DOOR_ENV) == "nox"


def command(verb: str, *args: str) -> str:
    """The command line that runs ``verb`` (``"gpu test"`` for a sub-verb) with ``args``."""
    if via_nox():
        session = _SESSIONS.get(verb, verb)
        return shlex.join(["nox", "-s", session, *(["--", *args] if args else [])])
    return shlex.join(["python", "-m", "sm120fork", *verb.split(), *args])
