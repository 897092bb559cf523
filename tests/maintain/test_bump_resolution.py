"""A hand resolution that moves a patch's change to another file (issue 31's trial).

On sglang 0.5.20 the code S2 changed had moved from ``server_args.py`` to
``arg_groups/overrides.py``; the maintainer resolved the conflict there and ran
``--continue``, which accepted it silently (its report said "effect does not hold:
review", nothing was printed); the bump then went on through two more patches and
stopped at its very end: the series export refused the commit, whose Fingerprint still
named the old file, with "give its message a DEP-3 header" (it had one) and a rebase of
the whole series as the remedy.  ``--continue`` now checks the resolved commit while it
is still HEAD, names the line at fault and the amend that mends it; once amended, the
resolution is judged by its own header.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120fork.errors import MaintenanceError
from sm120fork.maintain.bump import bump, bump_continue
from sm120fork.maintain.state import RESOLVED

from conftest import git
from helpers_maintain import (
    STACK,
    BumpWorkspace,
    make_bump_workspace,
    package_index,
    stack_of,
)


@pytest.mark.slow
def test_a_resolution_that_moved_the_change_is_checked_when_continue_accepts_it(
        bw: BumpWorkspace) -> None:
    with pytest.raises(MaintenanceError, match=r"0004-S4-conf-larger-limit\.patch conflicts"):
        bump(stack_of(bw.ws, STACK), "lib", "1.3.0", git_commit=bw.new.commit)
    tree = bw.ws.trees_dir / STACK / "lib"
    # Resolved as on sglang 0.5.20: upstream's file kept, the change made where the
    # code lives now.
    (tree / "demo_lib" / "conf.py").write_text("LIMIT = 4\n")
    (tree / "demo_lib" / "limits.py").write_text("LIMIT = 16  # sm12x\n")

    with pytest.raises(MaintenanceError) as err:
        bump_continue(bw.ws, STACK, "lib")
    message = err.value.message
    assert "resolution of 0004-S4-conf-larger-limit.patch" in message
    assert "Fingerprint names demo_lib/conf.py" in message
    assert "commit --amend" in message
    assert "--continue" in message

    body = git(tree, "log", "-1", "--format=%B")
    git(tree, "commit", "-q", "--amend", "-m", body.replace(
        "Fingerprint: demo_lib/conf.py:", "Fingerprint: demo_lib/limits.py:"))
    result = bump_continue(bw.ws, STACK, "lib")
    s4 = next(c for c in result.classifications if c.patch.startswith("0004"))
    assert s4.verdict == RESOLVED
    assert "the patch's effect holds on the resolved tree" in s4.evidence
    exported = (bw.series_dir / "0002-S4-conf-larger-limit.patch").read_text()
    assert "Fingerprint: demo_lib/limits.py: LIMIT = 16  # sm12x" in exported


@pytest.mark.slow
def test_a_conflict_whose_code_moved_to_another_file_names_where_it_is_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sglang 0.5.20 moved the code S2 changes out of ``server_args.py``; the bump said
    only "conflict" on ``server_args.py``, and the maintainer had to find where it went."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-11-30")
    bw = make_bump_workspace(tmp_path, new_files={
        "{pkg}/conf.py": "from demo_lib.limits import LIMIT  # noqa: F401\n",
        "{pkg}/limits.py": "LIMIT = 8\n"})
    with package_index([bw.old.sdist, bw.new.sdist], "demo-lib") as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        with pytest.raises(MaintenanceError) as err:
            bump(stack_of(bw.ws, STACK), "lib", "1.3.0", git_commit=bw.new.commit)
    assert "0004-S4-conf-larger-limit.patch conflicts" in err.value.message
    assert ("0004-S4-conf-larger-limit.patch stops the bump: the code it changes in "
            "demo_lib/conf.py is not there in 1.3.0: demo_lib/limits.py has 1 of its 1 "
            "line(s)") in (err.value.detail or "")


@pytest.mark.slow
def test_continue_says_at_once_when_a_resolution_lacks_the_patch_effect(
        bw: BumpWorkspace, caplog: pytest.LogCaptureFixture) -> None:
    """The warning was written only into the state and the report; ``--continue`` went on
    without a word."""
    with pytest.raises(MaintenanceError, match=r"0004-S4-conf-larger-limit\.patch conflicts"):
        bump(stack_of(bw.ws, STACK), "lib", "1.3.0", git_commit=bw.new.commit)
    tree = bw.ws.trees_dir / STACK / "lib"
    (tree / "demo_lib" / "conf.py").write_text("LIMIT = 32  # sm12x\n")  # not the fingerprint
    with caplog.at_level("WARNING", logger="sm120fork"):
        bump_continue(bw.ws, STACK, "lib")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "0004-S4-conf-larger-limit.patch: the patch's effect does not hold" in said
    assert "demo_lib/conf.py: LIMIT = 16  # sm12x: absent" in said
