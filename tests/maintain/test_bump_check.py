"""A patch that lands by a 3-way merge is checked before the bump moves on (issue 41).

On a release nobody had tuned for, a conflicting patch was applied by a 3-way merge and
called "still needed" / "merges cleanly (3-way)", though the merged code used a name the
release does not have; only a later probe met the NameError.  Here demo-lib 1.3.0 renamed
``DEFAULT`` to ``BASE`` and touched a context line of the patch: ``git am --3way`` merges
it cleanly, and the module fails at import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sm120fork.errors import MaintenanceError
from sm120fork.maintain.bump import bump, bump_continue
from sm120fork.maintain.state import (
    CHECK_PASSES,
    DROPPED_BY_HAND,
    MERGED_3WAY,
    MERGED_FAILS_CHECK,
    MERGED_UNCHECKED,
    MERGES_UNCHECKED,
    RESOLVED,
    STILL_NEEDED,
    BumpState,
)
from sm120fork.maintain.watch import APPLIES, _verdicts
from sm120fork.workspace import Workspace

from conftest import make_patch, make_upstream, stack_toml, write_series
from helpers_maintain import STACK, package_index, stack_of
from helpers_ws import project_entry

OLD = "DEFAULT = 8\n# one\n# two\n# three\nLIMIT = 1\n"
#: The name renamed, and a context line of the patch changed (not next to its change).
NEW = "BASE = 8\n# one, renamed\n# two\n# three\nLIMIT = 1\n"
PATCH = "0001-S1-sizes-double-the-limit.patch"


def make_workspace(tmp_path: Path, new: str) -> tuple[Workspace, str, list[Path]]:
    old_up = make_upstream(tmp_path / "old", "demo-lib", "1.2.3",
                           files={"{pkg}/sizes.py": OLD})
    new_up = make_upstream(tmp_path / "new", "demo-lib", "1.3.0",
                           files={"{pkg}/sizes.py": new})
    root = tmp_path / "toolkit"
    (root / "forks").mkdir(parents=True)
    entry = project_entry("lib", old_up)
    entry["url"] = ""
    (root / "forks" / f"{STACK}.toml").write_text(stack_toml(STACK, [entry]))
    d = root / "patches" / STACK / "lib"
    patch = make_patch(old_up.repo, d, "S1 sizes: double the limit", {
        "demo_lib/sizes.py": ("LIMIT = 1", "LIMIT = DEFAULT * 2  # sm12x")},
        "demo_lib/sizes.py: LIMIT = DEFAULT * 2  # sm12x")
    gate = make_patch(old_up.repo, d, "F1 gate: allow 12", {  # applies as it is
        "demo_lib/__init__.py": ("return [9, 10]", "return [9, 10, 12]")},
        "demo_lib/__init__.py: return [9, 10, 12]")
    write_series(d, [patch.name, gate.name])
    return Workspace(root), new_up.commit, [old_up.sdist, new_up.sdist]


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[
        Callable[[str], tuple[Workspace, str]]]:
    """Make the workspace (1.3.0's sizes.py given) and serve both releases on an index
    for the rest of the test."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-11-30")
    with contextlib.ExitStack() as stack:
        def make(new: str = NEW) -> tuple[Workspace, str]:
            ws, commit, sdists = make_workspace(tmp_path, new)
            url = stack.enter_context(package_index(sdists, "demo-lib"))
            monkeypatch.setenv("SM120FORK_INDEX_URL", url)
            return ws, commit
        yield make


@pytest.mark.slow
def test_a_3way_merge_that_fails_at_import_stops_the_bump_naming_patch_file_and_error(
        served: Callable[..., tuple[Workspace, str]]) -> None:
    ws, commit = served()
    with pytest.raises(MaintenanceError) as err:
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=commit)
    message, detail = err.value.message, err.value.detail or ""
    assert f"patch {PATCH} is {MERGED_FAILS_CHECK}" in message
    assert "demo_lib/sizes.py:5: NameError: name 'DEFAULT' is not defined" in message
    for option in ("--continue", "--skip", "--abort"):
        assert option in message
    assert f"{PATCH}: still needed" not in message + detail
    assert f"{PATCH}: {MERGES_UNCHECKED}" in detail  # the preview, before anything merged
    assert "check: compiled 1 Python file(s) the series touches; imported 1 patched " \
           "module(s) under the fake-GPU probe at capability 12.0 and 9.0" in detail
    said = "".join(p.read_text() for p in (ws.root / "reports").rglob("*.md"))
    assert MERGED_FAILS_CHECK in said
    assert "merges cleanly" not in said
    state = BumpState.load(ws, STACK, "lib")
    assert state is not None  # its failed_check is what `watch` reports
    assert state.failed_check[0].startswith(f"{PATCH}: demo_lib/sizes.py:5: NameError")

    # Resumable like a conflict: --continue checks again and stops again ...
    with pytest.raises(MaintenanceError, match=MERGED_FAILS_CHECK):
        bump_continue(ws, STACK, "lib")
    # ... until the tree is mended; the verdict then says how it landed and what ran.
    sizes = ws.trees_dir / STACK / "lib" / "demo_lib" / "sizes.py"
    sizes.write_text(sizes.read_text().replace("DEFAULT * 2", "BASE * 2"))
    result = bump_continue(ws, STACK, "lib")
    s1, f1 = result.classifications
    assert (s1.verdict, f1.verdict) == (RESOLVED, STILL_NEEDED)
    assert MERGED_3WAY in s1.evidence
    assert any(e.startswith(f"{MERGED_FAILS_CHECK}: {PATCH}") for e in s1.evidence)
    assert any(e.startswith(CHECK_PASSES) for e in s1.evidence)
    exported = (ws.root / "patches" / STACK / "lib" / PATCH).read_text()
    assert "+LIMIT = BASE * 2  # sm12x" in exported


@pytest.mark.slow
def test_skip_drops_a_merged_patch_that_fails_its_check(
        served: Callable[..., tuple[Workspace, str]]) -> None:
    ws, commit = served()
    with pytest.raises(MaintenanceError, match=MERGED_FAILS_CHECK):
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=commit)
    result = bump_continue(ws, STACK, "lib", skip=True)
    assert [c.verdict for c in result.classifications] == [DROPPED_BY_HAND, STILL_NEEDED]
    sizes = ws.trees_dir / STACK / "lib" / "demo_lib" / "sizes.py"
    assert sizes.read_text() == NEW


@pytest.mark.slow
def test_a_3way_merge_that_passes_its_check_says_which_check_ran(
        served: Callable[..., tuple[Workspace, str]]) -> None:
    ws, commit = served(NEW.replace("BASE", "DEFAULT"))
    s1, _ = bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=commit).classifications
    assert s1.verdict == STILL_NEEDED
    assert MERGED_3WAY in s1.evidence
    assert f"{CHECK_PASSES}: compiled 1 Python file(s) the series touches; imported 1 " \
           "patched module(s) under the fake-GPU probe at capability 12.0 and 9.0 and " \
           "looked up the global names their functions use on the lines the series " \
           "added" in s1.evidence


@pytest.mark.slow
def test_a_merge_whose_check_cannot_run_stops_saying_so_not_as_a_conflict(
        served: Callable[..., tuple[Workspace, str]]) -> None:
    """The merged module imports what this Python lacks (as torch on a machine without
    it): the check could not run, which is no verdict on the patch.  The bump stopped
    with a VerifyError that the watch, dropping the patch, reported as "conflicts"."""
    ws, commit = served("import sm120fork_absent_dependency\n"
                        + NEW.replace("BASE", "DEFAULT"))
    with pytest.raises(MaintenanceError) as err:
        bump(stack_of(ws, STACK), "lib", "1.3.0", git_commit=commit)
    message = err.value.message
    assert (f"patch {PATCH} is {MERGED_UNCHECKED}: the import probe could not run: this "
            "Python lacks 'sm120fork_absent_dependency'") in message
    assert "make the check runnable (install the probe's requirements" in message
    assert f"{PATCH}: still needed" not in message
    result = bump_continue(ws, STACK, "lib", skip=True)
    verdicts = [v.verdict for v in _verdicts("lib", result.classifications)]
    assert verdicts[0].startswith(f"{MERGED_UNCHECKED}: the import probe could not run")
    assert verdicts[1] == APPLIES
