"""Imports run one way: a stage imports only the stages below it, and none imports in a circle.

Read from the source with ``ast`` (every ``import``, also inside functions, and every
``"sm120fork.<stage>..."`` module name in a string, as ``importlib`` and ``python -m`` use
them), so a lazy import or an ``importlib`` load cannot hide an arrow.  A new arrow
between stages must be added to :data:`ALLOWED`, and the table must stay acyclic.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sm120fork"

#: The shared base every stage may use: the errors, the process runner and git, the entry
#: points' error boundary.
BASE = frozenset({"errors", "util", "entry", "__init__"})

#: stage -> the stages it may import (besides :data:`BASE`).  The data's way:
#: declare -> fetch -> patch -> (plugin) -> package -> verify -> maintain/upstream, with
#: cuda/ and harness/ below the stages that share them, and the entry points on top.
ALLOWED: Mapping[str, frozenset[str]] = {
    "errors": frozenset(),
    "util": frozenset({"errors"}),
    "entry": frozenset({"errors"}),
    "__init__": frozenset(),
    # The upstream SGLang layouts' adapters (declare validates a stack's layout name).
    "layouts": frozenset({"harness"}),
    "declare": frozenset({"layouts"}),
    "workspace": frozenset({"declare"}),
    "cuda": frozenset(),
    "harness": frozenset(),
    "fetch": frozenset({"declare", "workspace"}),
    "patch": frozenset({"declare", "workspace", "fetch"}),
    "plugin": frozenset({"declare", "workspace", "patch"}),
    "package": frozenset({"declare", "workspace", "fetch", "patch", "plugin"}),
    # a built wheel's requirements (package/wheel.py), for its test step's index
    "aot": frozenset({"declare", "workspace", "cuda", "package"}),
    # --stack NAME resolves a stack's wheels (its pin, its sdist), lazily: the GPU box's
    # plain runs still import none of them.
    "gpu": frozenset({"cuda", "harness", "declare", "workspace", "fetch", "layouts"}),
    # the all-reduce policy's reader and the methods' names (gpu/policy.py, gpu/methods.py,
    # vendored into the plugin wheel with the doctor)
    "doctor": frozenset({"cuda", "gpu"}),
    "verify": frozenset({"declare", "workspace", "cuda", "harness", "fetch", "patch",
                         "package", "gpu", "layouts"}),
    "maintain": frozenset({"declare", "workspace", "fetch", "patch", "package"}),
    "upstream": frozenset({"declare", "workspace", "fetch", "patch"}),
    "cli": frozenset({"declare", "workspace", "fetch", "patch", "plugin", "package", "aot",
                      "gpu", "doctor", "verify", "maintain", "upstream"}),
    "__main__": frozenset({"cli"}),
}

_MODULE_NAME = re.compile(r"^sm120fork\.([a-z_]+)(?:\.[a-z_0-9]+)*$")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _stage(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _module_strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """Module names in strings that load a module: an argument of ``import_module``,
    ``_module``, ``run_module``, ``find_spec``; a ``python -m`` target; a ``*MODULE``
    constant.  (A logger named ``sm120fork.plugin`` imports nothing.)"""
    def names(node: ast.AST) -> Iterator[ast.Constant]:
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and _MODULE_NAME.match(node.value)):
            yield node

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if "module" in called.lower() or called == "find_spec":
                for arg in node.args:
                    yield from names(arg)
        elif isinstance(node, ast.List | ast.Tuple):
            for flag, value in zip(node.elts, node.elts[1:], strict=False):
                if isinstance(flag, ast.Constant) and flag.value == "-m":
                    yield from names(value)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(
                    isinstance(t, ast.Name) and t.id.endswith("MODULE") for t in targets):
                yield from names(node.value)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every ``sm120fork`` module ``tree`` imports or loads by name, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # from sm120fork import gpu: the stage gpu
                yield f"{target}.{alias.name}", node.lineno
    for constant in _module_strings(tree):
        yield str(constant.value), constant.lineno


def stage_arrows(root: Path) -> dict[tuple[str, str], list[str]]:
    """(from stage, to stage) -> where, for every import between two stages under ``root``."""
    stages = {p.stem if p.is_file() else p.name for p in root.iterdir()
              if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    arrows: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        source = _stage(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, line in imported_modules(tree, module, path.name == "__init__.py"):
            if target != "sm120fork" and not target.startswith("sm120fork."):
                continue
            dest = _stage(target)
            if dest not in stages and dest != "__init__":
                continue  # "from sm120fork import __version__": the package itself
            if dest == source:
                continue
            where = f"{path.relative_to(root.parent)}:{line}"
            seen = arrows.setdefault((source, dest), [])
            if not any(w.startswith(f"{where} ") for w in seen):
                seen.append(f"{where} imports {target}")
    return arrows


def _permitted(stage: str, allowed: Mapping[str, frozenset[str]]) -> frozenset[str]:
    own = allowed.get(stage, frozenset())
    return own if stage in BASE else own | BASE


def back_arrows(arrows: Mapping[tuple[str, str], list[str]],
                allowed: Mapping[str, frozenset[str]]) -> list[str]:
    problems = []
    for (source, dest), where in sorted(arrows.items()):
        if source not in allowed:
            problems.append(f"{source}: a stage not in ALLOWED ({where[0]})")
        elif dest not in _permitted(source, allowed):
            problems.append(f"{source} -> {dest}: {'; '.join(where)}")
    return problems


def cycle(graph: Mapping[str, frozenset[str]]) -> list[str] | None:
    """One cycle of ``graph`` (:data:`BASE` below every other stage), or None."""
    edges = {node: _permitted(node, graph) for node in graph}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_table_of_allowed_imports_has_no_cycle() -> None:
    assert cycle(ALLOWED) is None


def test_no_stage_imports_a_later_stage() -> None:
    problems = back_arrows(stage_arrows(PACKAGE), ALLOWED)
    assert not problems, "imports against the stage order (tests/repo/test_import_order.py):\n" + \
        "\n".join(problems)


def test_every_stage_is_in_the_table() -> None:
    stages = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
              if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert stages <= set(ALLOWED), sorted(stages - set(ALLOWED))


# --- the checker itself finds what it must --------------------------------------------
def _package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / "sm120fork"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(("text", "arrow"), [
    ("from sm120fork.verify import check\n", ("patch", "verify")),
    ("def f():\n    from sm120fork.verify.check import x\n", ("patch", "verify")),
    ("import importlib\nM = importlib.import_module('sm120fork.verify.check')\n",
     ("patch", "verify")),
    ("PROBE_MODULE = 'sm120fork.verify.check'\n", ("patch", "verify")),
    ("CMD = [sys.executable, '-m', 'sm120fork.verify.check']\n", ("patch", "verify")),
    ("from sm120fork import verify\n", ("patch", "verify")),
    ("from ..verify import check\n", ("patch", "verify")),
])
def test_a_back_arrow_is_found_however_it_is_written(tmp_path: Path, text: str,
                                                     arrow: tuple[str, str]) -> None:
    root = _package(tmp_path, {"patch/__init__.py": "", "patch/apply.py": text,
                               "verify/__init__.py": "", "verify/check.py": ""})
    arrows = stage_arrows(root)
    assert arrow in arrows
    assert back_arrows(arrows, {"patch": frozenset(), "verify": frozenset({"patch"})})


def test_a_logger_name_is_no_import(tmp_path: Path) -> None:
    root = _package(tmp_path, {"patch/__init__.py": "", "verify/__init__.py": "",
                               "patch/apply.py": "import logging\n"
                                                 "log = logging.getLogger('sm120fork.verify')\n"})
    assert ("patch", "verify") not in stage_arrows(root)


def test_an_allowed_arrow_passes(tmp_path: Path) -> None:
    root = _package(tmp_path, {"patch/__init__.py": "", "patch/apply.py": "",
                               "verify/__init__.py": "",
                               "verify/check.py": "from sm120fork.patch.apply import x\n"})
    assert not back_arrows(stage_arrows(root), {"patch": frozenset(),
                                                "verify": frozenset({"patch"})})


def test_a_cycle_in_the_table_is_found() -> None:
    assert cycle({"patch": frozenset({"maintain"}), "maintain": frozenset({"patch"})}) == [
        "maintain", "patch", "maintain"]


def test_contributing_shows_the_same_table() -> None:
    """CONTRIBUTING.md's 'what it may import' column is this table, not a copy that drifts."""
    text = (PACKAGE.parents[1] / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Where each stage lives", 1)[1].split("\n## ", 1)[0]
    shown: dict[str, frozenset[str]] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        stages = [s.strip("/").removesuffix(".py") for s in re.findall(r"`([^`]+)`", cells[0])]
        deps = frozenset(re.findall(r"`([a-z_]+)`", cells[2]))
        if cells[2] != "-" and not deps:
            continue  # cli/: "the stages"
        for stage in stages:
            shown[stage] = deps
    assert set(shown) >= {"fetch", "patch", "package", "verify", "gpu", "doctor", "cuda"}
    assert {s: ALLOWED[s] for s in shown} == shown
