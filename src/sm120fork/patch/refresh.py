"""``refresh``: export a fork tree's commits back into its series, byte-stable.

The canonical form is the ``git format-patch`` invocation of patches/README.md with the
author date set to the patch's ``Last-Update`` day; a refresh with no change writes nothing.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import os
import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sm120fork.declare import Project, Stack
from sm120fork.errors import (
    CommandError,
    DirtyTreeError,
    MaintenanceError,
    SeriesError,
)
from sm120fork.fetch.source import UPSTREAM_TAG, source_key
from sm120fork.maintain.state import (
    BumpState,
)
from sm120fork.patch.apply import apply_series
from sm120fork.patch.series import (
    load_series,
    parse_patch,
    read_series_file,
)
from sm120fork.patch.tree import TreeState, keep_uncommitted_hint, open_tree, write_state
from sm120fork.util.proc import Git
from sm120fork.workspace import Workspace

#: The canonical export (patches/README.md); refresh writes exactly this.
FORMAT_PATCH = ("format-patch", "--zero-commit", "--no-signature", "--full-index",
                "--no-numbered", "--stat=80", "--stat-graph-width=20")


# --------------------------------------------------------------------------- refresh
@dataclass(frozen=True, kw_only=True)
class RefreshResult:
    stack: str
    project: str
    directory: Path
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    series_rewritten: bool

    @property
    def wrote_anything(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.series_rewritten)


_DATE_LINE = re.compile(r"^Date: .*$", re.MULTILINE)


def _canonical_date(text: str, last_update: str) -> str:
    """Set the header's ``Date:`` to the patch's Last-Update day, 00:00:00 UTC."""
    day = dt.datetime.fromisoformat(last_update).replace(tzinfo=dt.UTC)
    stamp = email.utils.format_datetime(day)
    return _DATE_LINE.sub(f"Date: {stamp}", text, count=1)


def export_series(repo: Git, directory: Path, base: str = UPSTREAM_TAG,
                  stack: str = "", project: str = "") -> RefreshResult:
    """Write ``base..HEAD`` of ``repo`` as the series in ``directory``; touch only changes."""
    with tempfile.TemporaryDirectory(prefix="sm120fork-refresh-") as tmp:
        out = repo(*FORMAT_PATCH, "-o", tmp, f"{base}..HEAD")
        exported = [Path(line) for line in out.splitlines() if line.strip()]
        new: dict[str, bytes] = {}
        for path in exported:
            text = path.read_text(encoding="utf-8")
            patch = parse_patch(path)  # refuses a commit without a DEP-3 header
            text = _canonical_date(text, patch.field("Last-Update"))
            new[path.name] = text.encode("utf-8")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        old_names = read_series_file(directory)
    except SeriesError:  # no series file yet, or one that refresh is about to replace
        old_names = []
    on_disk = {p.name for p in directory.glob("*.patch")}
    added: list[str] = []
    changed: list[str] = []
    unchanged: list[str] = []
    for name, data in new.items():
        target = directory / name
        if target.is_file() and target.read_bytes() == data:
            unchanged.append(name)
            continue
        (changed if target.is_file() else added).append(name)
        tmp_file = target.with_name(f".{name}.tmp")
        tmp_file.write_bytes(data)
        tmp_file.replace(target)
    removed = sorted((on_disk | set(old_names)) - set(new))
    for name in removed:
        (directory / name).unlink(missing_ok=True)
    series_file = directory / "series"
    rewritten = False
    if old_names != list(new) or not series_file.is_file():
        header = []
        if series_file.is_file():
            for line in series_file.read_text(encoding="utf-8").splitlines():
                if line.startswith("#") or not line.strip():
                    header.append(line)
                else:
                    break
        series_file.write_text("".join(f"{h}\n" for h in header)
                               + "".join(f"{n}\n" for n in new), encoding="utf-8")
        rewritten = True
    return RefreshResult(stack=stack, project=project, directory=directory,
                         added=tuple(added), removed=tuple(removed), changed=tuple(changed),
                         unchanged=tuple(unchanged), series_rewritten=rewritten)


def reapply_series(ws: Workspace, stack: Stack, project: Project, repo: Git,
                   base_commit: str) -> None:
    """Rebuild the fork tree from the (new) series so it is exactly what a build makes."""
    series = load_series(ws.series_dir(project))
    skey = source_key(project)
    write_state(repo.path, TreeState(source=skey, base=base_commit, series=series.digest,
                                     head="", applied=(), complete=False))
    head = apply_series(repo, series, stack=stack.name, project=project.key)
    write_state(repo.path, TreeState(source=skey, base=base_commit, series=series.digest,
                                     head=head, applied=tuple(series.names())))


def uncommitted_series_files(ws: Workspace, directory: Path) -> list[str]:
    """Files under ``directory`` that differ from the checkout's last commit (or are new).

    Empty when the toolkit root is not a git checkout: there is nothing to compare with.
    """
    try:
        checkout = Git(ws.root)
    except CommandError:
        return []
    rel = os.path.relpath(directory, ws.root)
    out = checkout("status", "--porcelain", "--untracked-files=all", "--", rel, quiet=True,
                   strip=False)
    return [line[3:] for line in out.splitlines() if line.strip()]


def refresh(ws: Workspace, stack_name: str, project_key: str, *,
            force: bool = False) -> RefreshResult:
    """Export the fork tree's commits into the project's series.

    Refuses, unless ``force``, when patch files of the series have uncommitted edits: the
    export would overwrite them with the fork tree's version.
    """
    stack = ws.stack(stack_name)
    project = stack.project(project_key)
    again = shlex.join(["python", "-m", "sm120fork", "refresh", stack.name, project.key])
    with ws.lock():
        if BumpState.load(ws, stack.name, project.key):
            bump = shlex.join(["python", "-m", "sm120fork", "bump", stack.name, project.key])
            raise MaintenanceError(
                "a bump of this project is in progress", where=f"{stack.name}/{project.key}",
                fix=f"finish it: `{bump} --continue` (or `{bump} --abort`)")
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
                    f"upstream..HEAD`), then `python -m sm120fork build --stack {stack.name} "
                    "--force`")
        series_dir = ws.series_dir(project)
        edited = uncommitted_series_files(ws, series_dir)
        if edited and not force:
            rel = shlex.quote(os.path.relpath(series_dir, ws.root))
            root = shlex.quote(str(ws.root))
            clean_tree = repo.head() == state.head and state.complete
            build = (f"`python -m sm120fork build --stack {stack.name}` makes the fork tree "
                     "from them (no refresh needed then); or " if clean_tree else "")
            raise DirtyTreeError(
                f"patch files have uncommitted edits that refresh would overwrite: "
                f"{', '.join(edited)}", where=str(series_dir),
                fix=f"{build}commit them first (`git -C {root} add -A {rel} && git -C {root} "
                    f"commit -m 'patches: keep edits'`), then `{again}`; or `{again} --force` "
                    "to overwrite them with the fork tree's commits")
        result = export_series(repo, series_dir, stack=stack.name, project=project.key)
        series = load_series(series_dir)
        if result.wrote_anything or state.series != series.digest or (
                repo.head() != state.head) or not state.complete:
            reapply_series(ws, stack, project, repo, state.base)
        return result
