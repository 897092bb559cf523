"""``refresh``: export a fork tree's commits back into its series, refusing to overwrite
local work or a bump's tree."""

from __future__ import annotations

import os
import shlex

from sm120fork.errors import DirtyTreeError, MaintenanceError
from sm120fork.fetch.kinds import source_key
from sm120fork.maintain.state import BumpState
from sm120fork.patch.refresh import (
    RefreshResult,
    export_series,
    note_written,
    uncommitted_series_files,
)
from sm120fork.patch.tree import (
    apply_recorded,
    keep_uncommitted_hint,
    open_tree,
    other_series,
    other_series_fix,
)
from sm120fork.resolved import ResolvedStack
from sm120fork.util.hint import command


def refresh(today: ResolvedStack, project_key: str, *, force: bool = False) -> RefreshResult:
    """Export the fork tree's commits into the project's series (``force``: over
    uncommitted hand edits of its files)."""
    ws, stack = today.ws, today.stack
    project = stack.project(project_key)
    again = command("refresh", stack.name, project.key)
    with ws.lock():
        if pending := BumpState.load(ws, stack.name, project.key):
            raise MaintenanceError(
                "a bump of this project is in progress", where=f"{stack.name}/{project.key}",
                fix=f"finish it: `{pending.cmd('--continue')}` (or `{pending.cmd('--abort')}`)")
        tree = open_tree(ws, stack, project)
        work, state, repo = tree.path, tree.state, tree.repo
        if repo.am_in_progress():
            raise DirtyTreeError(
                "a git am is in progress in the fork tree", where=str(work),
                fix=f"finish it (`git -C {shlex.quote(str(work))} am --continue`) or drop it "
                    f"(`git -C {shlex.quote(str(work))} am --abort`), then `{again}`")
        if repo.is_dirty():
            raise DirtyTreeError(
                "the fork tree has uncommitted changes; refresh exports commits only",
                where=str(work), fix=keep_uncommitted_hint(work, then=f"`{again}`"))
        if state.source != source_key(project):
            saved = shlex.quote(str(ws.state_dir / "saved" / stack.name / project.key))
            raise MaintenanceError(
                "the fork tree was made for another pin; its commits cannot be exported "
                "onto this one", where=str(work),
                fix=f"save them (`git -C {shlex.quote(str(work))} format-patch -o {saved} "
                    f"upstream..HEAD`), then "
                    f"`{command('build', '--stack', stack.name, '--force')}`")
        series_dir = ws.series_dir(project)
        edited = uncommitted_series_files(ws, series_dir)
        if edited and not force:
            rel = shlex.quote(os.path.relpath(series_dir, ws.root))
            root = shlex.quote(str(ws.root))
            clean_tree = repo.head() == state.head and state.complete
            build = (f"`{command('build', '--stack', stack.name)}` makes the fork tree "
                     "from them (no refresh needed then); or " if clean_tree else "")
            raise DirtyTreeError(
                f"patch files have uncommitted edits that refresh would overwrite: "
                f"{', '.join(edited)}", where=str(series_dir),
                fix=f"{build}commit them first (`git -C {root} add -A {rel} && git -C {root} "
                    f"commit -m 'patches: keep edits'`), then `{again}`; or `{again} --force` "
                    "to overwrite them with the fork tree's commits")
        stale = other_series(ws, stack, project, today.series[project.key])
        if stale and not force:  # its export would write that series back into patches/
            raise DirtyTreeError(
                f"refresh will not export the fork tree: {stale}", where=str(work),
                fix=f"{other_series_fix(ws, stack, project)}; or, to write the tree's "
                    f"commits over the series, `{again} --force`")
        result = export_series(repo, series_dir, stack=stack.name, project=project.key)
        note_written(ws, result.paths)
        if result.wrote_anything or state.series != result.series.digest or (
                repo.head() != state.head) or not state.complete:
            apply_recorded(repo, result.series, source=source_key(project), base=state.base,
                           stack=stack.name, project=project.key)
        return result
