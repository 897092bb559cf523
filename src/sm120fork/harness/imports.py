"""Probe: import a patched tree's modules with the GPU faked at one capability.

Run as ``python -m sm120fork.harness.imports '<json request>'`` (``{"capability": [12,
0], "tree": ..., "modules": [...]}``) in a fresh interpreter whose ``PYTHONPATH`` holds
the tree's package roots.  Each module is one observation: ``"ok"``, ``"error"`` (an
exception raised in the tree: ``detail`` is ``file:line: Type: message``, the deepest
frame inside the tree) or ``"missing"`` (a module the tree does not hold and this Python
lacks: a requirement of the probe, ``detail`` names it).  Stdlib and the fake-GPU
machinery only: it runs beside the tree under test.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from sm120fork.harness.fake_gpu import Observation, emit, start_probe


def _in_tree(path: str, tree: str) -> bool:
    return os.path.abspath(path).startswith(tree + os.sep)


def _where(exc: BaseException, tree: str) -> str:
    """``file:line`` of the deepest frame in the tree (a SyntaxError's own line first)."""
    if isinstance(exc, SyntaxError) and exc.filename and _in_tree(exc.filename, tree):
        return f"{os.path.relpath(exc.filename, tree)}:{exc.lineno or 0}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _in_tree(f.filename, tree)]
    if not frames:
        return ""
    return f"{os.path.relpath(frames[-1].filename, tree)}:{frames[-1].lineno or 0}"


def observe(module: str, tree: str) -> Observation:
    try:
        importlib.import_module(module)
    except Exception as exc:
        where = _where(exc, tree)
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        top = (missing or "").partition(".")[0]
        if top and not any(os.path.exists(os.path.join(root, top)) or
                           os.path.exists(os.path.join(root, f"{top}.py"))
                           for root in sys.path if _in_tree(root + os.sep, tree)):
            return {"name": module, "observed": "missing", "detail": top}
        return {"name": module, "observed": "error",
                "detail": f"{where}: {type(exc).__name__}: {exc}"}
    return {"name": module, "observed": "ok", "detail": ""}


def main(argv: list[str]) -> int:
    request = json.loads(argv[0])
    tree = os.path.abspath(request["tree"])
    start_probe(request["capability"], lazy=True)  # torch only if the tree imports it
    return emit([observe(m, tree) for m in request["modules"]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
