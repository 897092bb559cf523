"""The pin edit of a bump is one transaction (issue 31 item 3): interrupted at any step,
it is recovered with the command it names; ``--abort`` puts every file back byte for byte
(the report of an earlier try too, and only once the rest is back); ``--continue`` keeps
what the user fixed by hand meanwhile.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import sm120fork.maintain.bump as bump_module
import sm120fork.maintain.state as bump_state
from sm120fork.cli.main import main
from sm120fork.errors import MaintenanceError
from sm120fork.fetch.kinds import source_key
from sm120fork.maintain.bump import bump, bump_abort, bump_continue
from sm120fork.patch.tree import read_state
from sm120fork.util import proc

from helpers_maintain import (
    STACK,
    BumpWorkspace,
    hint_commands,
    make_bump_workspace,
    package_index,
    run_hint,
)

pytestmark = pytest.mark.slow

#: Every step a bump of an existing stack reaches, in order.
STAGES = ["pre-flight", "state saved", "old tree kept", "new tree made", "classified",
          "patch applied", "series exported", "declaration written", "tree rebuilt",
          "report written", "changelog written"]
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


@pytest.mark.parametrize("recover", ["--continue", "--abort"])
@pytest.mark.parametrize("step", STAGES)
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
    hints = hint_commands(err.partition("stopped part-way")[2])
    assert hints == [f"python -m sm120fork bump {STACK} lib --continue",
                     f"python -m sm120fork bump {STACK} lib --abort"], err
    assert _run(root, hints[["--continue", "--abort"].index(recover)]) == 0
    stack = clean.ws.stack(STACK)
    lib = stack.project("lib")
    tree = read_state(clean.ws.work_tree(stack, lib))  # at the pin (or, aborted before
    assert tree is not None or recover == "--abort"  # the bump made it, not there)
    assert tree is None or tree.source == source_key(lib)
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


def test_abort_at_a_conflict_restores_every_file_byte_for_byte(
        conflicting: BumpWorkspace) -> None:
    root = conflicting.ws.root
    earlier = _earlier_report(conflicting)
    before = files(root)
    with pytest.raises(MaintenanceError, match=r"conflicts with lib 1\.3\.0"):
        bump(conflicting.ws, STACK, "lib", "1.3.0", git_commit=conflicting.new.commit)
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
        bump(conflicting.ws, STACK, "lib", "1.3.0", git_commit=conflicting.new.commit)

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
        bump(ws, STACK, "lib", "1.3.0", git_commit=conflicting.new.commit)
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

