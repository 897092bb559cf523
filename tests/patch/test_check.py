"""The check of a patched tree (compile, import under the fake-GPU probe) on real trees."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sm120fork.errors import VerifyError
from sm120fork.patch.check import check_tree
from sm120fork.patch.series import Patch, parse_patch

from conftest import git, make_patch

BASE = {"demo_lib/__init__.py": "", "demo_lib/sizes.py": "LIMIT = 1\n",
        "demo_lib/kernel.cuh": "// kernel\n", "tools/run.py": "print('hi')\n"}


def patched(tmp_path: Path, edits: dict[str, tuple[str, str]],
            base: dict[str, str] | None = None) -> tuple[Path, list[Patch]]:
    """A tree of BASE (``base``: files of it changed) with one patch per edit applied (as
    a series makes a fork tree)."""
    repo = tmp_path / "tree"
    files = {**BASE, **(base or {})}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release")
    patches = []
    for i, (rel, (old, new)) in enumerate(edits.items(), 1):
        made = make_patch(repo, tmp_path / "series", f"P{i} change {rel}", {rel: (old, new)},
                          f"{rel}: {new.splitlines()[-1].strip()}")
        patches.append(parse_patch(made))
    return repo, patches


def test_a_tree_that_compiles_and_imports_passes_and_says_what_ran(tmp_path: Path) -> None:
    tree, patches = patched(tmp_path, {
        "demo_lib/sizes.py": ("LIMIT = 1", "LIMIT = 2"),
        "demo_lib/kernel.cuh": ("// kernel", "// kernel sm12x"),
        "tools/run.py": ("'hi'", "'sm12x'")})
    result = check_tree(tree, patches, cache=tmp_path / "cache")
    assert result.passed
    assert result.imported == ("demo_lib.sizes",)
    assert result.summary == (
        "compiled 2 Python file(s) the series touches; imported 1 patched module(s) under "
        "the fake-GPU probe at capability 12.0 and 9.0; 1 other file(s) not compiled here; "
        "1 file(s) not imported (not in a package)")
    assert not git(tree, "status", "--porcelain", "--ignored")  # no byte code left behind


def test_a_syntax_error_names_the_patch_file_and_line(tmp_path: Path) -> None:
    tree, patches = patched(tmp_path, {
        "tools/run.py": ("'hi'", "'sm12x'"),
        "demo_lib/sizes.py": ("LIMIT = 1", "LIMIT = (2")})
    (failure,) = check_tree(tree, patches, cache=tmp_path / "cache").failures
    assert (failure.patch, failure.where, failure.check) == (
        patches[1].name, "demo_lib/sizes.py:1", "compile")
    assert failure.error.startswith("SyntaxError: ")


def test_an_import_error_names_the_patch_file_line_and_the_error(tmp_path: Path) -> None:
    tree, patches = patched(tmp_path, {
        "demo_lib/sizes.py": ("LIMIT = 1", "\nLIMIT = DEFAULT * 2")})
    (failure,) = check_tree(tree, patches, cache=tmp_path / "cache").failures
    assert str(failure) == (f"{patches[0].name}: demo_lib/sizes.py:2: NameError: name "
                            "'DEFAULT' is not defined (import demo_lib.sizes at capability 12.0)")


def test_the_modules_are_imported_at_both_capabilities(tmp_path: Path) -> None:
    tree, patches = patched(tmp_path, {"demo_lib/sizes.py": ("LIMIT = 1", (
        "import torch\nif torch.cuda.get_device_capability() == (9, 0):\n"
        "    raise RuntimeError('SM90 path broken')"))})
    (failure,) = check_tree(tree, patches, cache=tmp_path / "cache").failures
    assert (failure.where, failure.error, failure.check) == (
        "demo_lib/sizes.py:3", "RuntimeError: SM90 path broken",
        "import demo_lib.sizes at capability 9.0")


def test_a_requirement_the_python_lacks_is_named_as_such(tmp_path: Path) -> None:
    tree, patches = patched(tmp_path, {
        "demo_lib/sizes.py": ("LIMIT = 1", "import no_such_requirement_sm12x")})
    with pytest.raises(VerifyError) as err:
        check_tree(tree, patches, cache=tmp_path / "cache")
    assert "lacks 'no_such_requirement_sm12x' (a requirement of the probe" in err.value.message
    assert err.value.where == sys.executable
    assert "pip install --group sglang-probe" in (err.value.fix or "")


def test_the_layouts_overlay_goes_first_only_when_the_imports_need_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installing the overlay needs the package index: a tree that imports with what this
    Python has never asks for it; one that lacks a module gets it, then imports."""
    from sm120fork.layouts import layer_boundary as checks

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "overlay_only_sm12x.py").write_text("VALUE = 1\n")
    asked: list[Path] = []

    def probe_path(cache: Path, python: str) -> list[str]:
        asked.append(cache)
        return [str(overlay)]
    monkeypatch.setattr(checks, "probe_path", probe_path)
    tree, patches = patched(tmp_path, {"demo_lib/sizes.py": ("LIMIT = 1", "LIMIT = 2")})
    assert check_tree(tree, patches, layout="layer_boundary", cache=tmp_path / "c").passed
    assert asked == []
    tree, patches = patched(tmp_path / "b", {"demo_lib/sizes.py": (
        "LIMIT = 1", "from overlay_only_sm12x import VALUE as LIMIT")})
    assert check_tree(tree, patches, layout="layer_boundary", cache=tmp_path / "c").passed
    assert asked == [tmp_path / "c"]


def test_a_name_a_function_uses_on_an_added_line_is_looked_up(tmp_path: Path) -> None:
    """Issue 41 trial: G2 resolved by hand onto sglang 0.5.22 kept ``is_mimo`` (0.5.23's
    name) inside a function; the module imported, so the check passed and the bump went
    on.  The release's own function that uses a name defined only elsewhere (as
    ``torch_npu`` on another platform) is not the series' doing: no failure."""
    tree, patches = patched(tmp_path, {"demo_lib/sizes.py": (
        "LIMIT = 1", "LIMIT = 1\n\n\ndef limit(tp):\n    return 2 if is_mimo else tp")},
        {"demo_lib/sizes.py": "def npu():\n    return torch_npu.x\n\n\nLIMIT = 1\n"})
    assert check_tree(tree, patches, cache=tmp_path / "cache").passed  # no tag: import only
    git(tree, "tag", "upstream", "HEAD~1")
    result = check_tree(tree, patches, cache=tmp_path / "cache")
    (failure,) = result.failures
    assert str(failure) == (
        f"{patches[0].name}: demo_lib/sizes.py:9: NameError: name 'is_mimo' is not defined "
        "(a function uses it; neither the module nor builtins define it) (names "
        "demo_lib.sizes at capability 12.0)")
    assert "looked up the global names their functions use on the lines the series " \
           "added" in result.summary
    (tree / "demo_lib" / "sizes.py").write_text(
        (tree / "demo_lib" / "sizes.py").read_text().replace("is_mimo", "LIMIT"))
    assert check_tree(tree, patches, cache=tmp_path / "cache").passed


def test_a_failure_names_the_patch_that_wrote_its_line(tmp_path: Path) -> None:
    """The trial's build blamed G7 (the last patch that changes overrides.py) for the
    name G2's resolution kept: the patch is the one whose commit wrote the line."""
    tree, patches = patched(tmp_path, {"demo_lib/sizes.py": (
        "LIMIT = 1", "LIMIT = 1\n\n\ndef limit(tp):\n    return 2 if is_mimo else tp")})
    later = make_patch(tree, tmp_path / "series", "P2 change the limit", {
        "demo_lib/sizes.py": ("LIMIT = 1", "LIMIT = 3")}, "demo_lib/sizes.py: LIMIT = 3")
    patches.append(parse_patch(later))
    git(tree, "tag", "upstream", "HEAD~2")
    (failure,) = check_tree(tree, patches, cache=tmp_path / "cache").failures
    assert (failure.patch, failure.where) == (patches[0].name, "demo_lib/sizes.py:5")
