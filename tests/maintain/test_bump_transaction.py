"""The pin edit of a bump is one transaction (issue 31 item 3): interrupted at any step,
it is recovered with the command it names; ``--abort`` puts every file back byte for byte
(the report of an earlier try too, and only once the rest is back); ``--continue`` keeps
what the user fixed by hand meanwhile.
"""

from __future__ import annotations

import shlex
import shutil
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import sm120fork.maintain.bump as bump_module
import sm120fork.maintain.state as bump_state
from sm120fork.cli.main import main
from sm120fork.errors import MaintenanceError
from sm120fork.fetch.kinds import fetch_source, source_key
from sm120fork.maintain.bump import bump, bump_abort, bump_continue
from sm120fork.maintain.refresh import refresh
from sm120fork.patch.series import Series
from sm120fork.patch.tree import apply_series, prepare_tree, read_state
from sm120fork.resolved import ResolvedStack
from sm120fork.util import proc
from sm120fork.workspace import Workspace

from conftest import git
from helpers_maintain import (
    STACK,
    BumpWorkspace,
    commit_checkout,
    hint_commands,
    make_bump_workspace,
    package_index,
    run_hint,
    stack_of,
)

pytestmark = pytest.mark.slow

#: Every step a bump of an existing stack reaches, in order.
STAGES = ["pre-flight", "state saved", "old tree kept", "new tree made", "classified",
          "patch applied", "series exported", "declaration written", "tree rebuilt",
          "report written", "changelog written", "old tree set aside", "finished"]
EARLIER_REPORT = "# a report of an earlier try\n"


def _workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, conflict: bool
               ) -> Iterator[BumpWorkspace]:
    monkeypatch.setenv("SM120FORK_TODAY", "2026-11-30")
    workspace = make_bump_workspace(
        tmp_path, new_files=None if conflict else {"{pkg}/conf.py": "LIMIT = 8\n"})
    with package_index([workspace.old.sdist, workspace.new.sdist], "demo-lib") as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        workspace.index_url = url
        yield workspace


@pytest.fixture
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BumpWorkspace]:
    """1.2.3 -> 1.3.0 without a conflict (the fourth patch's line is unchanged)."""
    yield from _workspace(tmp_path, monkeypatch, conflict=False)


@pytest.fixture
def conflicting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BumpWorkspace]:
    """1.2.3 -> 1.3.0, whose conf.py conflicts with the fourth patch."""
    yield from _workspace(tmp_path, monkeypatch, conflict=True)


def files(root: Path) -> dict[str, bytes]:
    """Every file the bump may write: forks/, patches/, reports/."""
    return {str(p.relative_to(root)): p.read_bytes()
            for top in ("forks", "patches", "reports") for p in sorted((root / top).rglob("*"))
            if p.is_file()}


def _earlier_report(bw: BumpWorkspace) -> Path:
    path = bw.ws.reports_dir / "bump" / f"{STACK}-lib-1.2.3-to-1.3.0.md"
    path.parent.mkdir(parents=True)
    path.write_text(EARLIER_REPORT)
    return path


def _run(root: Path, hint: str) -> int:
    """A hint's command as printed, in a process of its own (as the user runs it)."""
    assert shlex.split(hint)[:3] == ["python", "-m", "sm120fork"], hint
    done = run_hint(hint, root)
    assert done.returncode == 0, done.stderr
    return done.returncode


@pytest.mark.parametrize(("step", "recover"), [
    (step, recover) for step in STAGES for recover in ("--continue", "--abort")
    if step != "finished" or recover == "--continue"])  # finished: nothing to recover
def test_a_bump_interrupted_at_each_step_is_recovered_with_the_command_it_names(
        clean: BumpWorkspace, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], step: str, recover: str) -> None:
    root = clean.ws.root
    _earlier_report(clean)
    before = files(root)
    reached: list[str] = []

    def interrupt(name: str) -> None:
        reached.append(name)
        if name == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(bump_state, "stage_hook", interrupt)
    try:
        assert main(["--root", str(root), "bump", STACK, "lib", "1.3.0",
                     "--git-commit", clean.new.commit]) == 130
    finally:  # this process goes on after the interrupt, unlike the user's
        proc.allow_children()
    monkeypatch.setattr(bump_state, "stage_hook", None)
    assert reached[-1] == step
    err = " ".join(capsys.readouterr().err.split())
    if step == "pre-flight":
        assert "the bump stopped before it wrote anything" in err
        assert hint_commands(err.partition("before it wrote anything")[2]) == [
            f"python -m sm120fork bump {STACK} lib 1.3.0 --git-commit {clean.new.commit}"]
        assert files(root) == before
        return
    if step == "finished":  # every file written: nothing to resume or undo
        assert "had finished (every file written)" in err
        assert hint_commands(err) == []
        recover = "--continue"
    else:
        hints = hint_commands(err.partition("stopped part-way")[2])
        assert hints == [f"python -m sm120fork bump {STACK} lib --continue",
                         f"python -m sm120fork bump {STACK} lib --abort"], err
        assert _run(root, hints[["--continue", "--abort"].index(recover)]) == 0
    stack = clean.ws.stack(STACK)
    lib = stack.project("lib")
    tree = read_state(clean.ws.work_tree(stack, lib))  # at the pin (or, aborted before
    assert tree is not None or recover == "--abort"  # the bump made it, not there)
    assert tree is None or tree.source == source_key(lib)
    assert_builds_as_is(clean.ws)
    assert not (clean.ws.state_dir / "bump").exists() or not any(
        (clean.ws.state_dir / "bump").iterdir())
    if recover == "--abort":
        assert files(root) == before
        assert lib.version == "1.2.3"
        assert not clean.ws.work_tree(stack, lib, "pre-bump").exists()
        return
    assert lib.version == "1.3.0"
    report = (clean.ws.reports_dir / "bump" / f"{STACK}-lib-1.2.3-to-1.3.0.md").read_text()
    assert "## Summary" in report
    names = (clean.series_dir / "series").read_text().split()
    assert len(names) == 2  # the two patches 1.3.0 has not merged


def assert_builds_as_is(ws: Workspace) -> None:
    """The fork tree is one ``build`` uses with no flag: the pin's and the series' (made
    now if there is none), readable by git, nothing to discard."""
    stack = ws.stack(STACK)
    lib = stack.project("lib")
    existed = ws.work_tree(stack, lib).exists()
    # build's own step; refuses a broken tree
    tree = prepare_tree(ws, stack, lib, patches=ResolvedStack.of(ws, stack).series["lib"].patches)
    assert tree.reused == existed
    assert tree.state.source == source_key(lib)
    assert tree.repo("rev-parse", "HEAD^{tree}")
    assert not list(ws.trees_dir.glob("*/*@pre-bump"))
    assert not (ws.state_dir / "bump").exists() or not any((ws.state_dir / "bump").iterdir())


def _remove_git_of_old_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first removal of a folder holding the old fork tree is stopped part-way: its
    ``.git`` is gone, the rest is there (as Ctrl-C leaves a tree of 30,000 files)."""
    real = shutil.rmtree
    hit: list[Path] = []

    def part_way(path: str | Path, *args: object, **kwargs: object) -> None:
        folder = Path(path)
        trees = [t for t in (folder, *folder.glob("*"), *folder.glob("*/*"))
                 if t.name.endswith("pre-bump") and (t / ".git").is_dir()]
        if trees and not hit:
            hit.append(trees[0])
            real(trees[0] / ".git")
            raise KeyboardInterrupt
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "rmtree", part_way)


def test_a_bump_stopped_while_it_removes_the_old_tree_leaves_a_tree_build_uses(
        clean: BumpWorkspace, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: interrupted in the bump's last step, the old tree half removed; the
    ``--abort`` it advised put that tree back (no ``.git``), said "back at 1.2.3", and
    only ``build --rebuild --force`` mended it.  Now the bump is written before the old
    tree goes: nothing is left to undo, and the tree is the new pin's."""
    root = clean.ws.root
    _remove_git_of_old_tree(monkeypatch)
    try:
        assert main(["--root", str(root), "bump", STACK, "lib", "1.3.0",
                     "--git-commit", clean.new.commit]) == 130
    finally:
        proc.allow_children()
    monkeypatch.undo()
    err = " ".join(capsys.readouterr().err.split())
    for hint in hint_commands(err):  # an undo it advises, as the maintainer ran it
        if hint.endswith("--abort"):
            _run(root, hint)
    assert_builds_as_is(clean.ws)
    assert "had finished (every file written)" in err
    assert clean.ws.stack(STACK).project("lib").version == "1.3.0"


def test_abort_makes_a_broken_old_tree_again_before_it_says_back_at(
        conflicting: BumpWorkspace, capsys: pytest.CaptureFixture[str]) -> None:
    """The old tree the bump kept aside lost its ``.git`` (an older toolkit's interrupted
    clean-up): ``--abort`` does not call that "back at 1.2.3"; it makes the tree again."""
    ws = conflicting.ws
    with pytest.raises(MaintenanceError, match=r"conflicts with lib 1\.3\.0"):
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=conflicting.new.commit)
    kept = ws.trees_dir / STACK / "lib@pre-bump"
    shutil.rmtree(kept / ".git")
    assert main(["--root", str(ws.root), "bump", STACK, "lib", "--abort"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "is back at 1.2.3; lib: fork tree made again at 1.2.3 and its series" in out, out
    assert_builds_as_is(ws)


@pytest.mark.parametrize("recover", ["--continue", "--abort"])
@pytest.mark.parametrize("fetch", [1, 2], ids=["old-tree", "new-tree"])
def test_a_bump_stopped_while_it_unpacks_a_download_recovers(
        clean: BumpWorkspace, monkeypatch: pytest.MonkeyPatch, fetch: int, recover: str
        ) -> None:
    """Stopped while unpacking the old release (its tree before the bump) or the new one:
    a tree with files and no toolkit state."""
    ws = clean.ws
    real = fetch_source
    calls: list[Path] = []

    def part_way(project: object, kind: str, work: Path, **kwargs: object) -> object:
        calls.append(work)
        info = real(project, kind, work, **kwargs)  # type: ignore[arg-type]
        if len(calls) == fetch:
            shutil.rmtree(work / ".git")
            raise KeyboardInterrupt
        return info

    monkeypatch.setattr("sm120fork.patch.tree.fetch_source", part_way)
    with pytest.raises(KeyboardInterrupt):
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=clean.new.commit)
    monkeypatch.undo()
    if recover == "--abort":
        bump_abort(ws, STACK, "lib")
    else:
        bump_continue(ws, STACK, "lib")
    assert ws.stack(STACK).project("lib").version == (
        "1.2.3" if recover == "--abort" else "1.3.0")
    assert_builds_as_is(ws)


def test_continue_after_a_stop_in_the_tree_rebuild_keeps_every_patch(
        clean: BumpWorkspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped while the last step rebuilt the tree from the exported series (one patch
    of two applied): ``--continue`` exported that half tree as the series."""
    ws = clean.ws
    real = apply_series

    def part_way(repo: object, series: Series, **kwargs: object) -> str:
        real(repo, replace(series, patches=series.patches[:1]), **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    monkeypatch.setattr("sm120fork.patch.tree.apply_series", part_way)
    with pytest.raises(KeyboardInterrupt):
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=clean.new.commit)
    monkeypatch.undo()
    bump_continue(ws, STACK, "lib")
    assert len((clean.series_dir / "series").read_text().split()) == 2
    assert_builds_as_is(ws)


#: The steps a ``--skip`` at a conflict goes through.
SKIP_STAGES = ["series exported", "declaration written", "tree rebuilt",
               "changelog written", "old tree set aside"]


@pytest.mark.parametrize("recover", ["--continue", "--abort"])
@pytest.mark.parametrize("step", SKIP_STAGES)
def test_a_skip_interrupted_at_each_step_recovers(
        conflicting: BumpWorkspace, monkeypatch: pytest.MonkeyPatch, step: str,
        recover: str) -> None:
    ws = conflicting.ws
    before = files(ws.root)
    with pytest.raises(MaintenanceError, match=r"conflicts with lib 1\.3\.0"):
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=conflicting.new.commit)

    def interrupt(name: str) -> None:
        if name == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(bump_state, "stage_hook", interrupt)
    with pytest.raises(KeyboardInterrupt):
        bump_continue(ws, STACK, "lib", skip=True)
    monkeypatch.setattr(bump_state, "stage_hook", None)
    if recover == "--abort":
        bump_abort(ws, STACK, "lib")
        assert files(ws.root) == before
    else:
        result = bump_continue(ws, STACK, "lib")
        assert [c.verdict for c in result.classifications][-1] == "conflict, dropped by hand"
    assert_builds_as_is(ws)


def test_abort_at_a_conflict_restores_every_file_byte_for_byte(
        conflicting: BumpWorkspace) -> None:
    root = conflicting.ws.root
    earlier = _earlier_report(conflicting)
    before = files(root)
    with pytest.raises(MaintenanceError, match=r"conflicts with lib 1\.3\.0"):
        bump(stack_of(conflicting.ws, STACK), "lib", "1.3.0", git_commit=conflicting.new.commit)
    assert earlier.read_text() != EARLIER_REPORT  # the bump's own report, in progress
    bump_abort(conflicting.ws, STACK, "lib")
    assert files(root) == before


def test_an_abort_interrupted_part_way_names_the_command_that_finishes_it(
        conflicting: BumpWorkspace, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Found on a fresh clone (issue 31's trial): an ``--abort`` stopped by SIGTERM said
    only "interrupted: bump stopped", naming no command; running ``--abort`` again
    finishes it."""
    root = conflicting.ws.root
    before = files(root)
    with pytest.raises(MaintenanceError, match=r"conflicts with lib 1\.3\.0"):
        bump(stack_of(conflicting.ws, STACK), "lib", "1.3.0", git_commit=conflicting.new.commit)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # after the fork tree is back, before the files are

    monkeypatch.setattr(bump_module, "restore", interrupted)
    try:
        assert main(["--root", str(root), "bump", STACK, "lib", "--abort"]) == 130
    finally:
        proc.allow_children()
    monkeypatch.setattr(bump_module, "restore", bump_state.restore)
    err = " ".join(capsys.readouterr().err.split())
    hints = hint_commands(err.partition("stopped part-way")[2])
    assert hints == [f"python -m sm120fork bump {STACK} lib --abort"], err
    assert _run(root, hints[0]) == 0
    assert files(root) == before


def test_continue_keeps_a_hand_fix_of_the_declaration(conflicting: BumpWorkspace) -> None:
    """Stopped at a conflict, the user fixes the toml by hand (here: the local label and a
    comment); ``--continue`` writes the new pin into the toml as it is now."""
    ws = conflicting.ws
    with pytest.raises(MaintenanceError, match=r"conflicts with lib 1\.3\.0") as err:
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=conflicting.new.commit)
    toml = ws.forks_dir / f"{STACK}.toml"
    fixed = toml.read_text().replace('local_label = "sm120.1"',
                                     '# fixed by hand while the bump stopped\n'
                                     'local_label = "sm120.2"')
    assert fixed != toml.read_text()
    toml.write_text(fixed)
    assert "--skip" in (err.value.fix or "")
    bump_continue(ws, STACK, "lib", skip=True)
    text = toml.read_text()
    assert "# fixed by hand while the bump stopped" in text
    declared = tomllib.loads(text)["projects"]["lib"]
    assert declared["local_label"] == "sm120.2"
    assert declared["version"] == "1.3.0"



def test_refresh_accepts_the_series_a_bump_wrote(clean: BumpWorkspace) -> None:
    """Issue 41: after a bump (its patches not committed yet) ``refresh`` refused the
    series the bump wrote as "uncommitted edits"."""
    ws = clean.ws
    commit_checkout(ws.root)
    bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=clean.new.commit)
    stack = ws.stack(STACK)
    tree = ws.work_tree(stack, stack.project("lib"))
    (tree / "note.txt").write_text("a fix made after the bump\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "--amend", "--no-edit")
    assert len(refresh(ResolvedStack.named(ws, STACK), "lib").changed) == 1
