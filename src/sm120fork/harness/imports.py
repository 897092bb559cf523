"""Probe: import a patched tree's modules with the GPU faked at one capability.

``python -m sm120fork.harness.imports '<json request>'``; each module is one observation:
``ok``, ``error`` (the deepest frame inside the tree), ``undefined`` (an added line uses a
global nothing defines) or ``missing`` (neither the tree nor this Python holds it).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import os
import symtable
import sys
import traceback
from collections.abc import Collection
from types import ModuleType

from sm120fork.harness.fake_gpu import Observation, emit, start_probe


def _in_tree(path: str, tree: str) -> bool:
    return os.path.abspath(path).startswith(tree + os.sep)


def _where(exc: BaseException, tree: str) -> str:
    """``file:line`` of the deepest frame in the tree (a SyntaxError's own line first)."""
    spots = [(f.filename, f.lineno) for f in traceback.extract_tb(exc.__traceback__)]
    if isinstance(exc, SyntaxError) and exc.filename:
        spots.append((exc.filename, exc.lineno))
    inside = [(path, line) for path, line in spots if _in_tree(path, tree)]
    return f"{os.path.relpath(inside[-1][0], tree)}:{inside[-1][1] or 0}" if inside else ""


def undefined(module: ModuleType, lines: Collection[int], tree: str) -> str:
    """``file:line: NameError: ...`` of the first global name a function of ``module``
    uses on one of ``lines`` that the module (imported) and builtins do not define."""
    path = module.__file__ or ""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    known = {*vars(module), *vars(builtins)}
    unknown: set[str] = set()
    tables = [symtable.symtable(source, path, "exec")]
    while tables:  # the module's own level ran at import: its functions' bodies did not
        table = tables.pop()
        tables += table.get_children()
        if table.get_type() == "function":
            unknown |= {s.get_name() for s in table.get_symbols() if s.is_global()
                        and s.is_referenced() and s.get_name() not in known}
    used = sorted((n.lineno, n.id) for n in ast.walk(ast.parse(source, path))
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                  and n.id in unknown and n.lineno in lines)
    if not used:
        return ""
    line, name = used[0]
    return (f"{os.path.relpath(path, tree)}:{line}: NameError: name {name!r} is not defined "
            "(a function uses it; neither the module nor builtins define it)")


def observe(module: str, tree: str, added: Collection[int] = ()) -> Observation:
    try:
        imported = importlib.import_module(module)
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
    if added and (found := undefined(imported, set(added), tree)):
        return {"name": module, "observed": "undefined", "detail": found}
    return {"name": module, "observed": "ok", "detail": ""}


def main(argv: list[str]) -> int:
    request = json.loads(argv[0])
    tree = os.path.abspath(request["tree"])
    start_probe(request["capability"], lazy=True)  # torch only if the tree imports it
    added = request.get("added", {})
    return emit([observe(m, tree, added.get(m, ())) for m in request["modules"]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
