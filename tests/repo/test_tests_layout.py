"""The tests are laid out like the package (CONTRIBUTING.md, "Where the tests live").

``tests/<stage>/test_*.py`` tests ``src/sm120fork/<stage>/``; ``tests/core/`` the top-level
modules (``entry.py``, ``errors.py``, ``declare.py``, ``workspace.py``); ``tests/repo/`` the
checkout as a whole (noxfile, CI, import order, committed evidence, this layout).  The
``tests/`` root holds only what several folders share: ``conftest.py`` and ``helpers_*.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "src" / "sm120fork"
#: Folders of tests/ that are no stage of the package.
OTHER_FOLDERS = {"core": "the top-level modules of sm120fork",
                 "repo": "the checkout as a whole"}


def stages(package: Path) -> set[str]:
    return {p.parent.name for p in package.glob("*/__init__.py")}


def top_level_modules(package: Path) -> set[str]:
    return {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}


def named_modules(path: Path, tests: Path) -> set[str]:
    """The ``sm120fork.<x>`` a test module imports (anywhere in it, or through a shared
    ``helpers_*.py`` of the tests/ root), or reads from the source tree
    (``... / "sm120fork" / "<x>"``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            helper = tests / f"{node.module}.py"
            if node.module.startswith("helpers_") and helper.is_file():
                found |= named_modules(helper, tests)
            elif parts[0] == "sm120fork":
                found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "sm120fork" and len(parts) > 1:
                    found.add(parts[1])
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
              and isinstance(node.right, ast.Constant) and isinstance(node.right.value, str)
              and isinstance(node.left, ast.BinOp)
              and isinstance(node.left.right, ast.Constant)
              and node.left.right.value == "sm120fork"):
            found.add(node.right.value)
    return found


def layout_problems(tests: Path, package: Path) -> list[str]:
    """Each test file or folder outside the layout, with what to do about it."""
    known = stages(package)
    top = top_level_modules(package)
    problems = []
    for path in sorted(tests.glob("test_*.py")):
        imported = named_modules(path, tests)
        target = sorted(imported & known) or ["core" if imported & top else "repo"]
        problems.append(f"tests/{path.name}: a test module in the tests/ root; move it to "
                        f"tests/{target[0]}/")
    for folder in sorted(p for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"
                         and not p.name.startswith(".")):
        if folder.name not in known and folder.name not in OTHER_FOLDERS:
            problems.append(f"tests/{folder.name}/: no src/sm120fork/{folder.name}/ package "
                            f"(a test folder is a stage or one of {sorted(OTHER_FOLDERS)})")
            continue
        for path in sorted(folder.rglob("test_*.py")):
            rel = path.relative_to(tests).as_posix()
            if path.parent != folder:
                problems.append(f"tests/{rel}: one folder level only (tests/<stage>/test_*.py)")
            named = named_modules(path, tests)
            if folder.name == "core" and not named & top:
                problems.append(f"tests/{rel}: imports no top-level module of sm120fork "
                                f"({', '.join(sorted(top))}); move it to its stage's folder")
            elif folder.name in known and folder.name not in named:
                where = sorted(named & known)
                problems.append(f"tests/{rel}: does not import sm120fork.{folder.name}"
                                + (f"; move it to tests/{where[0]}/" if where else ""))
    seen: dict[str, str] = {}
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests).as_posix()
        if path.name == "conftest.py" and path.parent != tests:
            problems.append(f"tests/{rel}: one conftest.py, in tests/ (tests import it by name)")
        elif path.name in seen and path.name != "__init__.py":
            problems.append(f"tests/{rel}: its module name clashes with tests/{seen[path.name]} "
                            "(no __init__.py: pytest imports test modules by file name)")
        seen.setdefault(path.name, rel)
    return problems


def test_the_tests_are_laid_out_like_the_package() -> None:
    assert not layout_problems(TESTS, PACKAGE), "\n".join(layout_problems(TESTS, PACKAGE))


def test_a_test_file_outside_the_layout_is_found(tmp_path: Path) -> None:
    package = tmp_path / "src" / "sm120fork"
    for stage in ("gpu", "patch"):
        (package / stage).mkdir(parents=True)
        (package / stage / "__init__.py").write_text("")
    (package / "errors.py").write_text("")
    tests = tmp_path / "tests"
    files = {
        "conftest.py": "",
        "helpers_ws.py": "",
        "test_root.py": "from sm120fork.gpu import report\n",
        "gpu/test_fine.py": "from sm120fork.gpu.report import x\n",
        "gpu/test_reads.py": 'GPU = ROOT / "src" / "sm120fork" / "gpu"\n',
        "helpers_gpu.py": "from sm120fork.gpu import report\n",
        "gpu/test_helped.py": "from helpers_gpu import report\n",
        "gpu/test_wrong.py": "import sm120fork.patch.series\n",
        "core/test_errors.py": "from sm120fork import errors\n",
        "core/test_stage.py": "from sm120fork.gpu import report\n",
        "repo/test_noxfile.py": "",
        "repo/test_fine.py": "",
        "build/test_old.py": "",
        "patch/deeper/test_deep.py": "from sm120fork.patch import series\n",
        "patch/conftest.py": "",
    }
    for rel, text in files.items():
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text(text)
    assert layout_problems(tests, package) == [
        "tests/test_root.py: a test module in the tests/ root; move it to tests/gpu/",
        "tests/build/: no src/sm120fork/build/ package (a test folder is a stage or one of "
        "['core', 'repo'])",
        "tests/core/test_stage.py: imports no top-level module of sm120fork (errors); move it "
        "to its stage's folder",
        "tests/gpu/test_wrong.py: does not import sm120fork.gpu; move it to tests/patch/",
        "tests/patch/deeper/test_deep.py: one folder level only (tests/<stage>/test_*.py)",
        "tests/patch/conftest.py: one conftest.py, in tests/ (tests import it by name)",
        "tests/repo/test_fine.py: its module name clashes with tests/gpu/test_fine.py "
        "(no __init__.py: pytest imports test modules by file name)",
    ]
