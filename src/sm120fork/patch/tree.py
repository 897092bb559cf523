"""Fork work trees: pinned upstream plus a series, re-made only when inputs change.  A tree
whose HEAD or files differ from its state (``.git/sm120fork-state.json``) holds local work,
never reset without ``force``; one a run left mid-way is recovered.  A series is applied as
commits exactly or not at all: checked on a scratch index first, then ``git am`` without
fuzz or 3-way; a failure rolls back and names the patch and hunk."""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sm120fork.declare import Project, Stack
from sm120fork.errors import (
    CommandError,
    ConfigError,
    DirtyTreeError,
    MaintenanceError,
    PatchError,
)
from sm120fork.fetch.kinds import UPSTREAM_TAG, fetch_source, source_key
from sm120fork.patch.series import Patch, Series
from sm120fork.util import typed
from sm120fork.util.files import atomic_write_text
from sm120fork.util.git import Git
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")
STATE_FILE = "sm120fork-state.json"
UNCOMMITTED = "it has uncommitted changes"
LOCAL_COMMITS = "its HEAD moved (local commits)"


@dataclass(frozen=True, kw_only=True)
class TreeState:
    source: str
    base: str
    series: str
    head: str
    applied: tuple[str, ...]
    complete: bool = True


@dataclass(frozen=True, kw_only=True)
class Tree:
    path: Path
    repo: Git
    state: TreeState
    reused: bool


def read_state(work: Path) -> TreeState | None:
    path = work / ".git" / STATE_FILE
    try:
        return typed.read(TreeState, typed.json_file(path), path)
    except ConfigError:
        return None


def write_state(work: Path, state: TreeState) -> None:
    atomic_write_text(work / ".git" / STATE_FILE, json.dumps(asdict(state), indent=1))


def _local_changes(work: Path, state: TreeState | None) -> str | None:
    try:
        repo = Git(work)
    except CommandError:
        return "it is not a git repository"
    if state is None:
        return "it has no toolkit state (made by hand?)"
    if not state.complete:
        return None  # an interrupted toolkit run: safe to recover
    try:
        if repo.is_dirty():
            return UNCOMMITTED
        if repo.head() != state.head:
            return LOCAL_COMMITS
    except CommandError:
        return "git cannot read it"
    return None


def keep_local_work_hint(work: Path, why: str, stack: Stack, project: Project,
                         variant: str = "") -> str:
    discard = "pass --force to discard it"
    if variant or why not in (UNCOMMITTED, LOCAL_COMMITS):
        return f"refresh cannot export it: {discard}"  # not a tree refresh knows
    refresh = command("refresh", stack.name, project.key)
    if why == UNCOMMITTED:
        return f"{keep_uncommitted_hint(work, then=f'`{refresh}`')}; or {discard}"
    return f"keep it in the series: `{refresh}`; or {discard}"


def local_work(ws: Workspace, stack: Stack, project: Project) -> str | None:
    work = ws.work_tree(stack, project)
    return _local_changes(work, read_state(work)) if work.exists() else None


def other_series(ws: Workspace, stack: Stack, project: Project, series: Series) -> str | None:
    """Why the fork tree was made from another series than ``series`` (to be neither
    reused nor exported back), or None."""
    work = ws.work_tree(stack, project)
    state = read_state(work)
    if state is None or not state.complete or state.series == series.digest or (
            state.source != source_key(project)):  # another pin: remade, never reused
        return None
    made, now = list(state.applied), series.names()
    gone = [n for n in made if n not in now]
    new = [n for n in now if n not in made]
    changed = "; ".join(part for part in (
        f"not in the series now: {', '.join(gone)}" if gone else "",
        f"new in the series: {', '.join(new)}" if new else "",
        "another order" if made != now and not gone and not new else "",
        "the same patch names, other bytes" if made == now else "") if part)
    return (f"it was made from another series than {project.series} holds now "
            f"(series digest {state.series[:12]}, now {series.digest[:12]}: {changed})")


def other_series_fix(ws: Workspace, stack: Stack, project: Project) -> str:
    work = ws.work_tree(stack, project)
    state = read_state(work)
    rebuild = command("build", "--stack", stack.name, "--rebuild")
    try:
        moved = state is not None and Git(work).head() != state.head
    except CommandError:
        moved = False
    if not moved:
        return f"make it again from the series: `{rebuild}`"
    saved = shlex.quote(str(ws.state_dir / "saved" / stack.name / project.key))
    w = shlex.quote(str(work))
    return (f"save the commits you made in it (`git -C {w} format-patch -o {saved} "
            f"{state.head if state else 'upstream'}..HEAD`), then make it again from the "
            f"series: `{rebuild} --force`")


def open_tree(ws: Workspace, stack: Stack, project: Project) -> Tree:
    work = ws.work_tree(stack, project)
    state = read_state(work)
    if state is None:
        raise MaintenanceError("there is no fork tree", where=str(work),
                               fix=f"run: {command('build', '--stack', stack.name)}")
    return Tree(path=work, repo=Git(work), state=state, reused=True)


def prepare_tree(ws: Workspace, stack: Stack, project: Project, *,
                 patches: Sequence[Patch], variant: str = "",
                 force: bool = False) -> Tree:
    """Pinned upstream + ``patches``."""
    work = ws.work_tree(stack, project, variant)
    skey = source_key(project)
    series = Series(directory=ws.series_dir(project), patches=tuple(patches))
    state = read_state(work)
    if work.exists() and (why := _local_changes(work, state)):
        if not force:
            raise DirtyTreeError(f"the fork work tree has local work: {why}", where=str(work),
                                 fix=keep_local_work_hint(work, why, stack, project, variant))
        log.warning("discarding local work in %s (--force): %s", work, why)
        shutil.rmtree(work)
        state = None
    if state and state.complete and state.source == skey and state.series == series.digest:
        return Tree(path=work, repo=Git(work), state=state, reused=True)
    if state is None or state.source != skey:
        work.parent.mkdir(parents=True, exist_ok=True)
        base = fetch_source(project, project.source, work, ws=ws)
    else:
        base = state.base
    repo = Git(work)
    new_state = apply_recorded(repo, series, source=skey, base=base, stack=stack.name,
                               project=project.key)
    return Tree(path=work, repo=repo, state=new_state, reused=False)


def apply_recorded(repo: Git, series: Series, *, source: str, base: str, stack: str,
                   project: str) -> TreeState:
    """State written before (incomplete, so a killed run is recovered) and after."""
    state = TreeState(source=source, base=base, series=series.digest, head="", applied=(),
                      complete=False)
    write_state(repo.path, state)
    head = apply_series(repo, series, stack=stack, project=project)
    state = replace(state, head=head, applied=tuple(series.names()), complete=True)
    write_state(repo.path, state)
    return state


def keep_uncommitted_hint(work: Path, then: str) -> str:
    """How to keep or set aside uncommitted changes (``-u``: untracked files count too)."""
    w = shlex.quote(str(work))
    return (f"fold them into the last patch (`git -C {w} add -A && git -C {w} commit --amend "
            f"--no-edit`) or commit them with a DEP-3 header (patches/README.md), or set them "
            f"aside (`git -C {w} stash -u`); then {then}")


_FAILED = re.compile(r"patch failed: (\S+?):(\d+)")
_MISSING = re.compile(r"(?:error: )?(\S+): (?:does not exist in index|No such file or directory)")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class ApplyFailure:
    patch: str
    file: str
    hunk: str
    message: str


def _locate(patch: Patch, output: str) -> tuple[str, str]:
    if m := _FAILED.search(output):
        file, line = m.group(1), int(m.group(2))
        text = patch.path.read_text(encoding="utf-8", errors="replace")
        section = text.split(f"diff --git a/{file} b/{file}", 1)
        if len(section) == 2:
            body = section[1].split("\ndiff --git ", 1)[0]
            for number, hm in enumerate(_HUNK.finditer(body), 1):
                if int(hm.group(1)) == line:
                    # Quoted: the header's context often holds a lone "(" of the code.
                    return file, f"hunk #{number} `{hm.group(0).strip()}`"
        return file, f"hunk at line {line}"
    if m2 := _MISSING.search(output):
        return m2.group(1), "file missing in the source"
    return (patch.files[0] if patch.files else "?"), "unknown hunk"


def check_series(repo: Git, series: Series) -> list[ApplyFailure]:
    """Dry-run the series on a scratch index; the work tree and index stay untouched."""
    with tempfile.TemporaryDirectory(prefix="sm120fork-index.") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        repo("read-tree", UPSTREAM_TAG, env=env)
        for p in series.patches:
            try:
                repo("apply", "--cached", "--check", str(p.path), env=env)
            except CommandError as exc:
                file, hunk = _locate(p, exc.detail or "")
                return [ApplyFailure(patch=p.name, file=file, hunk=hunk,
                                     message=(exc.detail or "").strip())]
            repo("apply", "--cached", str(p.path), env=env)
    return []


def reset_to_upstream(repo: Git) -> None:
    if repo.am_in_progress():
        repo("am", "--abort")
    repo("checkout", "-q", "-B", "main", UPSTREAM_TAG)
    repo("reset", "-q", "--hard", UPSTREAM_TAG)
    repo("clean", "-q", "-fdx")


def apply_series(repo: Git, series: Series, *, stack: str, project: str) -> str:
    if failures := check_series(repo, series):
        f = failures[0]
        raise PatchError(
            f"patch {f.patch} does not apply exactly: {f.file}, {f.hunk}",
            where=f"stack {stack}, project {project}",
            fix="rebase the patch on the pinned upstream (its fork tree's commit, exported "
                f"by `{command('refresh', stack, project)}`) and build again",
            detail=f.message)
    reset_to_upstream(repo)
    for p in series.patches:
        try:
            repo.am([p.path], extra=("--committer-date-is-author-date",))
        except CommandError as exc:
            file, hunk = _locate(p, exc.detail or "")
            reset_to_upstream(repo)
            raise PatchError(f"patch {p.name} does not apply exactly: {file}, {hunk}",
                             where=f"stack {stack}, project {project}",
                             detail=exc.detail) from exc
    return repo.head()
