"""refresh and the recovery hints around fork trees: each hint works as printed."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pytest

from sm120fork.cli.main import main
from sm120fork.errors import DirtyTreeError, ToolkitError
from sm120fork.maintain.refresh import refresh
from sm120fork.package.kinds import Options
from sm120fork.package.stack import build_stack
from sm120fork.resolved import ResolvedStack

from conftest import git
from helpers_maintain import commit_checkout, hint_commands, run_hint
from helpers_ws import DemoWorkspace, make_demo

pytestmark = pytest.mark.slow


@pytest.fixture
def demo(tmp_path: Path) -> DemoWorkspace:
    d = make_demo(tmp_path)
    build_stack(d.ws, d.ws.stack("demo"))
    commit_checkout(d.ws.root)
    return d


def lib_tree(demo: DemoWorkspace) -> Path:
    stack = demo.ws.stack("demo")
    return demo.ws.work_tree(stack, stack.project("lib"))


def last_patch(demo: DemoWorkspace) -> Path:
    lib = demo.series_dir("lib")
    return lib / (lib / "series").read_text().split()[-1]


def test_refresh_refuses_uncommitted_patch_edits_unless_forced(demo: DemoWorkspace) -> None:
    root = demo.ws.root
    lib = demo.series_dir("lib")
    first = lib / (lib / "series").read_text().split()[0]
    edited = first.read_text().replace("Description: F1 gate: allow 12",
                                       "Description: F1 gate: allow 12 (edited)")
    first.write_text(edited)
    with pytest.raises(DirtyTreeError) as err:
        refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    assert f"patches/demo/lib/{first.name}" in err.value.message
    assert first.read_text() == edited
    assert main(["--root", str(root), "-q", "refresh", "demo", "lib"]) == 8
    assert first.read_text() == edited
    build, commit, again, force = hint_commands(err.value.fix)
    assert (build, again, force) == ("python -m sm120fork build --stack demo",
                                     "python -m sm120fork refresh demo lib",
                                     "python -m sm120fork refresh demo lib --force")
    # The fork tree has no local work: the build makes it from the edited series.
    assert run_hint(build, root).returncode == 0
    assert "(edited)" in git(lib_tree(demo), "log", "--format=%B", "upstream..HEAD")
    assert first.read_text() == edited
    # Committed, the edits are safe and refresh goes ahead (keeping them: the tree has them).
    assert run_hint(commit, root).returncode == 0
    rerun = run_hint(again, root)
    assert rerun.returncode == 0, rerun.stderr
    assert "(edited)" in first.read_text()
    # --force overwrites an uncommitted edit with the fork tree's version.
    first.write_text(first.read_text().replace("(edited)", "(edited again)"))
    assert refresh(ResolvedStack.named(demo.ws, "demo"), "lib", force=True).changed == (first.name,)
    assert "(edited again)" not in first.read_text()
    assert "(edited)" in first.read_text()


@pytest.mark.parametrize("way", ["amend", "stash"])
def test_the_dirty_fork_tree_hints_of_refresh_work_as_printed(demo: DemoWorkspace,
                                                              way: str) -> None:
    work = lib_tree(demo)
    kernel = work / "demo_lib" / "kernel.cuh"
    kernel.write_text(kernel.read_text() + "// wip\n")
    (work / "demo_lib" / "extra.cuh").write_text("// new file\n")  # untracked counts too
    with pytest.raises(DirtyTreeError, match="uncommitted changes") as err:
        refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    amend, stash, again = hint_commands(err.value.fix)
    assert stash.endswith("stash -u")
    done = run_hint(amend if way == "amend" else stash, demo.ws.root)
    assert done.returncode == 0, done.stderr
    rerun = run_hint(again, demo.ws.root)
    assert rerun.returncode == 0, rerun.stderr
    text = last_patch(demo).read_text()
    assert ("+// wip" in text and "+// new file" in text) == (way == "amend")


def test_the_builds_dirty_tree_hint_works_as_printed(demo: DemoWorkspace) -> None:
    work = lib_tree(demo)
    kernel = work / "demo_lib" / "kernel.cuh"
    kernel.write_text(kernel.read_text() + "// wip\n")
    with pytest.raises(DirtyTreeError, match="local work: it has uncommitted changes") as err:
        build_stack(demo.ws, demo.ws.stack("demo"), Options(rebuild=True), only=["lib"])
    amend, _stash, again = hint_commands(err.value.fix)
    assert again == "python -m sm120fork refresh demo lib"
    assert "--force" in (err.value.fix or "")
    for command in (amend, again):
        done = run_hint(command, demo.ws.root)
        assert done.returncode == 0, done.stderr
    assert "+// wip" in last_patch(demo).read_text()
    assert build_stack(demo.ws, demo.ws.stack("demo"), only=["lib"])[0].cached is False


def test_a_cached_build_says_the_fork_tree_has_local_work(demo: DemoWorkspace,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    kernel = lib_tree(demo) / "demo_lib" / "kernel.cuh"
    kernel.write_text(kernel.read_text() + "// wip\n")
    logger = logging.getLogger("sm120fork")
    logger.addHandler(caplog.handler)  # the CLI may have stopped propagation in this process
    try:
        builds = build_stack(demo.ws, demo.ws.stack("demo"), only=["lib"])
    finally:
        logger.removeHandler(caplog.handler)
    assert builds[0].cached
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("has local work (it has uncommitted changes)" in w and "refresh demo lib" in w
               for w in warnings), warnings


@pytest.mark.parametrize("edit", ["reverted edit", "corrupt patch"])
def test_a_fork_tree_of_another_series_is_neither_reused_nor_exported(
        demo: DemoWorkspace, edit: str) -> None:
    """The tree records the series it was made from: after the series went back (a patch
    edit reverted in patches/, a corrupt patch restored), a cached build refuses the tree
    that still holds the other series and refresh will not write it back; the fix the
    error names (``build --rebuild``) makes the tree from the series."""
    root, patch = demo.ws.root, last_patch(demo)
    original = patch.read_bytes()
    if edit == "reverted edit":  # an edit that builds, later reverted
        patch.write_text(patch.read_text().replace("Description: F3 guards",
                                                   "Description: F3 guards (edited)"))
        build_stack(demo.ws, demo.ws.stack("demo"), only=["lib"])
    else:  # applies, but commits another change than the series' (whatever the build says)
        patch.write_text("".join(
            line.replace("guard removed", "garbled") if line.startswith("+#") else line
            for line in patch.read_text().splitlines(keepends=True)))
        with contextlib.suppress(ToolkitError):
            build_stack(demo.ws, demo.ws.stack("demo"), only=["lib"])
        assert "garbled" in git(lib_tree(demo), "show", "HEAD")
    held = git(lib_tree(demo), "log", "-1", "--format=%H")
    git(root, "checkout", "-q", "--", "patches")
    assert patch.read_bytes() == original
    with pytest.raises(DirtyTreeError, match="made from another series") as err:
        build_stack(demo.ws, demo.ws.stack("demo"), only=["lib"])
    assert git(lib_tree(demo), "log", "-1", "--format=%H") == held
    with pytest.raises(DirtyTreeError, match="will not export the fork tree"):
        refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    assert patch.read_bytes() == original
    assert main(["--root", str(root), "-q", "refresh", "demo", "lib"]) == 8
    (rebuild,) = hint_commands(err.value.fix)
    assert rebuild == "python -m sm120fork build --stack demo --rebuild"
    done = run_hint(rebuild, root)
    assert done.returncode == 0, done.stderr
    log = git(lib_tree(demo), "log", "-p", "upstream..HEAD")
    assert "(edited)" not in log
    assert "garbled" not in log
    assert not refresh(ResolvedStack.named(demo.ws, "demo"), "lib").wrote_anything
    assert patch.read_bytes() == original
    assert build_stack(demo.ws, demo.ws.stack("demo"), only=["lib"])[0].cached


def amend_last_commit(tree: Path, name: str) -> None:
    """A change made in the fork tree, folded into its last patch."""
    (tree / name).write_text(f"{name}\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "--amend", "--no-edit")


def test_refresh_accepts_the_patches_it_wrote_itself(demo: DemoWorkspace) -> None:
    """Issue 41: a second refresh refused the first one's patches as "uncommitted
    edits"; only an edit made by hand is refused."""
    tree = lib_tree(demo)
    amend_last_commit(tree, "first.txt")
    assert refresh(ResolvedStack.named(demo.ws, "demo"), "lib").changed == (last_patch(demo).name,)
    amend_last_commit(tree, "second.txt")
    assert refresh(ResolvedStack.named(demo.ws, "demo"), "lib").changed == (last_patch(demo).name,)
    assert "second.txt" in last_patch(demo).read_text()
    last_patch(demo).write_text(last_patch(demo).read_text() + "\n")  # by hand
    amend_last_commit(tree, "third.txt")
    with pytest.raises(DirtyTreeError, match=last_patch(demo).name):
        refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
