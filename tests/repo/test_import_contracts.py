"""The import contracts of pyproject.toml (``lint-imports``, run by ``nox -s lint``) hold for
the package, and each kind of rule they state breaks on the import it forbids: a contract
that cannot fail guards nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the checkout's contracts over the package under ``root/src``
    (run from there, so that copy is the one found)."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config",
                           str(ROOT / "pyproject.toml")], cwd=root / "src",
                          capture_output=True, text=True, check=False)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src" / "sm120fork", tmp_path / "src" / "sm120fork",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_package_keeps_every_contract(copy: Path) -> None:
    done = lint_imports(copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kept, 0 broken." in done.stdout


#: module -> a forbidden import added to it -> what lint-imports says.
BAD_IMPORTS = {
    # a later stage, lazily, inside a function
    "patch/series.py": ("def _late() -> None:\n    from sm120fork.verify import proof\n",
                        "sm120fork.patch is not allowed to import sm120fork.verify"),
    # a lower stage the table does not list for it
    "gpu/core/cases.py": ("from sm120fork.plugin import build\n",
                     "sm120fork.gpu is not allowed to import sm120fork.plugin"),
    # one GPU harness importing another, or the harnesses' core importing one
    "gpu/ab/report.py": ("from sm120fork.gpu.bench import report as bench_report\n",
                         "sm120fork.gpu.ab is not allowed to import sm120fork.gpu.bench"),
    "gpu/core/runs.py": ("def _late() -> None:\n    from sm120fork.gpu.layer import run\n",
                         "sm120fork.gpu.core is not allowed to import sm120fork.gpu.layer"),
    # the plugin wheel's vendored doctor: a dependency of the toolkit ...
    "doctor/rules.py": ("import rich\n", "sm120fork.doctor is not allowed to import rich"),
    # ... or a stage the wheel does not carry, however indirectly
    "gpu/policy.py": ("from sm120fork import workspace\n",
                      "sm120fork.gpu.policy is not allowed to import sm120fork.workspace"),
    # pip's modules, which are no API (its command line is)
    "fetch/git.py": ("def _late() -> None:\n    from pip._internal.models.link import Link\n",
                     "sm120fork.fetch.git -> pip"),
    # a new stage nobody placed
    "newstage/__init__.py": ("", "sm120fork.newstage"),
}


def test_each_forbidden_import_breaks_a_contract(copy: Path) -> None:
    for module, (text, _) in BAD_IMPORTS.items():
        path = copy / "src" / "sm120fork" / module
        path.parent.mkdir(exist_ok=True)
        path.write_text((path.read_text() if path.exists() else "") + "\n" + text)
    done = lint_imports(copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert [said for _, said in BAD_IMPORTS.values() if said not in done.stdout] == []
