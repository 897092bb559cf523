"""``bump``: re-pin one project and re-classify each patch on the new upstream.

Verdicts: still needed / upstreamed identically / upstreamed differently / conflict.  A
conflict stops like ``git am``: the fork tree holds the conflict markers, ``--continue``
resumes and ``--abort`` restores the previous tree, pin and series byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from sm120fork.declare import Project, SdistPin, Stack, WheelPin
from sm120fork.errors import (
    CommandError,
    ConfigError,
    MaintenanceError,
    SourceError,
)
from sm120fork.fetch.sdist import download_sdist
from sm120fork.fetch.source import UPSTREAM_TAG
from sm120fork.maintain.classify import MERGES_3WAY, classification, classify, preview
from sm120fork.maintain.pin import (
    commit_from_sdist,
    create_stack,
    declaration_with_pin,
    index_sdist,
    index_wheels,
    pinned_project,
    remove_created_stack,
)
from sm120fork.maintain.release import release_check
from sm120fork.maintain.report import (
    preview_lines,
    report_path,
    write_bump_report,
    write_changelog,
)
from sm120fork.maintain.state import (
    BEFORE_BASE_REF,
    BEFORE_REF,
    CONFLICT,
    DROPPED_BY_HAND,
    RESOLVED,
    STILL_NEEDED,
    BumpState,
    Classification,
    today,
)
from sm120fork.patch.refresh import RefreshResult, export_series, reapply_series
from sm120fork.patch.series import (
    Patch,
    Series,
    load_series,
)
from sm120fork.patch.tree import prepare_tree
from sm120fork.patch.upstream_match import match_upstream
from sm120fork.util.git import Git
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

_SHA1 = re.compile(r"[0-9a-f]{40}")
_CONFLICT_MARK = re.compile(r"^(<<<<<<<|>>>>>>>) ", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class BumpResult:
    stack: str
    project: str
    old_version: str
    new_version: str
    classifications: tuple[Classification, ...]
    report: Path
    changelog: Path
    refresh: RefreshResult
    range_diff: str
    new_stack_created: bool
    #: The published wheels the stack now ships unchanged: the series ended empty.
    used_as_published: tuple[WheelPin, ...] = ()
    #: Wheels of the new release the new pin does not declare, and the summary line
    #: (``maintain.release.release_check``, as ``status`` shows it).
    undeclared_files: tuple[str, ...] = ()
    release_files: str = ""


def _state_paths(ws: Workspace, state: BumpState) -> tuple[Path, Path, Path]:
    d = BumpState.directory(ws, state.stack, state.project)
    return d, d / "series", d / "declaration.toml"


def bump(ws: Workspace, stack_name: str, project_key: str, revision: str, *,
         allow_downgrade: bool = False, new_stack: str | None = None,
         version: str | None = None, git_commit: str | None = None) -> BumpResult:
    """Re-pin ``project_key`` of ``stack_name`` to ``revision`` (a version or a git SHA)."""
    with ws.lock():
        target_stack = new_stack or stack_name
        pending = BumpState.load(ws, target_stack, project_key)
        if pending is not None:
            wanted = version or revision
            if wanted not in (pending.new_version,
                              (pending.new_pin.get("git") or {}).get("commit")):
                raise MaintenanceError(
                    f"a bump to {pending.new_version} is in progress",
                    where=f"{target_stack}/{project_key}",
                    fix="finish it with --continue or undo it with --abort")
            return _resume(ws, pending)
        stack = ws.stack(stack_name)
        project = stack.project(project_key)
        old = Version(project.version)
        if _SHA1.fullmatch(revision):
            if not version:
                raise MaintenanceError("bumping to a git commit needs --version",
                                       fix="pass the PEP 440 version of that commit")
            new_version = version
            new_pin: dict[str, Any] = {
                "source": "git",
                "git": {"url": project.git_pin.url, "tag": "", "commit": revision,
                        "commit_verified": True, "note": ""},
                "sdist": {}}
        else:
            new_version = version or revision
            new_pin = {}
        try:
            new = Version(new_version)
        except InvalidVersion:
            raise ConfigError(f"{new_version!r} is neither a PEP 440 version nor a 40-hex "
                              "git commit SHA", where="bump") from None
        if new.local is not None:
            raise ConfigError("give the upstream version, without a local label",
                              where="bump")
        if new == old and not new_pin:
            raise MaintenanceError(f"{project.key} is already pinned to {project.version}",
                                   where=stack.name)
        if new < old and not allow_downgrade:
            raise MaintenanceError(f"{new_version} is older than the pinned {project.version}",
                                   where=f"{stack.name}/{project.key}",
                                   fix="pass --allow-downgrade if you mean it")
        if new_pin:  # a git commit: pin that version's sdist when the index has one
            try:
                filename, sha256, _ = index_sdist(project, new)
                new_pin["sdist"] = {"filename": filename, "sha256": sha256, "url": ""}
            except SourceError:  # an unreleased commit: the sdist pin stays (unused by git)
                new_pin["sdist"] = dataclasses.asdict(project.sdist_pin)
        elif project.source == "wheel":  # the published wheels are the input: no sdist
            new_pin = _wheel_pin(project, new_version, git_commit)
        else:
            filename, sha256, url = index_sdist(project, new)
            probe = dataclasses.replace(
                project, version=new_version,
                sdist=SdistPin(filename=filename, sha256=sha256, url=url))
            sdist = download_sdist(probe, ws.sdist_cache)
            commit = git_commit or commit_from_sdist(sdist)
            if not commit:
                raise MaintenanceError(
                    f"the git commit of {project.distribution} {new_version} is unknown",
                    fix="pass --git-commit SHA (the sdist records none and the upstream "
                        "repository is not consulted)")
            note = ("commit given with --git-commit" if git_commit else
                    "commit recorded in the sdist's own build metadata")
            new_pin = {
                "source": project.source,
                "git": {"url": project.git_pin.url,
                        "tag": project.git_pin.tag.replace(project.version, new_version)
                        if project.version in project.git_pin.tag else f"v{new_version}",
                        "commit": commit, "commit_verified": False,
                        "note": f"{note}; not checked against the upstream repository"},
                "sdist": {"filename": filename, "sha256": sha256, "url": ""}}
        created = False
        if new_stack:
            stack = create_stack(ws, stack, project, new_stack)
            project = stack.project(project_key)
            created = True
        # Keep the fork tree as it is now (old pin + series) to restore on --abort and
        # to give `git am --3way` the blobs the patches were written against.
        try:
            old_tree = prepare_tree(ws, stack, project)
        except BaseException:
            if created:  # leave nothing behind: the new stack is only a copy so far
                (ws.forks_dir / f"{stack.name}.toml").unlink(missing_ok=True)
                shutil.rmtree(ws.root / "patches" / stack.name, ignore_errors=True)
                shutil.rmtree(ws.work_tree(stack, project), ignore_errors=True)
            raise
        state = BumpState(
            stack=stack.name, project=project.key, old_version=project.version,
            new_version=new_version, new_pin=new_pin, created_stack=created,
            declaration=str(stack.path), series_dir=str(ws.series_dir(project)),
            results=[], started=today(), command=command(
                "bump", stack_name, project_key, revision,
                *(["--new-stack", new_stack] if new_stack else []),
                *(["--version", version] if version else []),
                *(["--git-commit", git_commit] if git_commit else []),
                *(["--allow-downgrade"] if allow_downgrade else [])))
        d, series_backup, decl_backup = _state_paths(ws, state)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        if report_path(ws, state).is_file():  # a report of an earlier try: --abort restores it
            shutil.copyfile(report_path(ws, state), d / "report.md")
        shutil.copytree(ws.series_dir(project), series_backup)
        shutil.copyfile(stack.path, decl_backup)
        pre = ws.work_tree(stack, project, "pre-bump")
        if pre.exists():
            shutil.rmtree(pre)
        state.save(ws)
        os.replace(old_tree.path, pre)
        try:
            tree = prepare_tree(ws, stack, pinned_project(project, state), patches=())
        except BaseException:
            shutil.rmtree(ws.work_tree(stack, project), ignore_errors=True)
            os.replace(pre, ws.work_tree(stack, project))
            shutil.rmtree(d, ignore_errors=True)
            if created:
                remove_created_stack(ws, state)
            raise
        _start_new_tree(ws, stack, project, state, tree.repo)
        return _resume(ws, state)


def _wheel_pin(project: Project, new_version: str, git_commit: str | None) -> dict[str, Any]:
    """The pin of a ``wheel`` source at ``new_version``: its published wheels (the series
    is applied to them), and a git pin only when the commit is given."""
    probe = dataclasses.replace(project, version=new_version, wheels=())
    wheels = index_wheels(probe, Version(new_version))
    if not wheels:
        raise MaintenanceError(
            f"{project.distribution} {new_version} has no wheel on the package index",
            where=f"projects.{project.key}", fix="check the version, or wait until upstream "
                                                 "publishes its wheels")
    git = None
    if git_commit:
        git = {"url": project.git.url if project.git else "", "tag": f"v{new_version}",
               "commit": git_commit, "commit_verified": False,
               "note": "commit given with --git-commit; not checked against the upstream "
                       "repository"}
    return {"source": "wheel", "git": git, "sdist": None, "wheels": wheels}


def _start_new_tree(ws: Workspace, stack: Stack, project: Project, state: BumpState,
                    repo: Git | None = None) -> None:
    """The fork tree at the new upstream, with the old series' commits fetched beside it."""
    if repo is None:  # a run killed while unpacking the new upstream: start it again
        repo = prepare_tree(ws, stack, pinned_project(project, state), patches=(),
                            force=True).repo
    pre = ws.work_tree(stack, project, "pre-bump")
    repo("fetch", "--quiet", "--no-tags", str(pre),
         f"+HEAD:{BEFORE_REF}", f"+refs/tags/{UPSTREAM_TAG}:{BEFORE_BASE_REF}")
    state.head = repo.head()
    state.save(ws)



def _series_before(ws: Workspace, state: BumpState) -> Series:
    _, series_backup, _ = _state_paths(ws, state)
    return load_series(series_backup)


def _record(state: BumpState, patch: Patch, verdict: str, evidence: list[str]) -> None:
    state.results.append(classification(patch, verdict, evidence).to_json())


def _conflict_message(state: BumpState, patch: Patch, repo: Git, tree: str) -> str:
    files = repo("diff", "--name-only", "--diff-filter=U", quiet=True).split()
    return (f"patch {patch.name} conflicts with {state.project} {state.new_version}"
            f"{': ' + ', '.join(files) if files else ''}; the fork tree {tree} stops at it "
            "with conflict markers in place")


def _resume(ws: Workspace, state: BumpState, *, skip: bool = False) -> BumpResult:
    stack = ws.stack(state.stack)
    project = stack.project(state.project)
    if not state.head:
        _start_new_tree(ws, stack, project, state)
    repo = Git(ws.work_tree(stack, project))
    series = _series_before(ws, state)
    new_version = Version(state.new_version)
    def cmd(option: str) -> str:
        return command("bump", state.stack, state.project, option)
    if skip and not state.conflict_head:
        raise MaintenanceError("no conflict to skip", where=f"{state.stack}/{state.project}",
                               fix=f"`{cmd('--continue')}` resumes the bump")
    if state.phase == "classify":
        if state.conflict_head:
            patch = series.patches[state.next_index]
            if skip and repo.am_in_progress():  # drop the conflicting patch, like git am
                repo("am", "--skip")
            if repo.am_in_progress():
                unmerged = repo("diff", "--name-only", "--diff-filter=U", quiet=True).split()
                marked = [f for f in sorted({*unmerged, *patch.files})
                          if (repo.path / f).is_file() and _CONFLICT_MARK.search(
                              (repo.path / f).read_text(errors="replace"))]
                if marked:
                    raise MaintenanceError(
                        f"patch {patch.name} still has conflict markers: {', '.join(marked)}",
                        where=str(repo.path),
                        fix=f"edit them, then `{cmd('--continue')}`; or drop the patch: "
                            f"`{cmd('--skip')}`; or `{cmd('--abort')}`")
                repo("add", "-A")
                if repo("diff", "--cached", "--name-only", "HEAD", quiet=True):
                    repo("am", "--continue")
                else:  # resolved to upstream's side: nothing left of the patch
                    repo("am", "--skip")
            if repo.head() != state.conflict_head:
                holds = match_upstream(repo, patch, "HEAD").already_upstream
                _record(state, patch, RESOLVED, [
                    *state.conflict_evidence, "conflict resolved by hand in the fork tree",
                    "the patch's effect holds on the resolved tree" if holds else
                    "WARNING: the patch's effect does not hold on the resolved tree: review"])
            else:
                _record(state, patch, DROPPED_BY_HAND, [
                    *state.conflict_evidence,
                    "conflict resolved by dropping the patch (--skip)"])
            state.next_index += 1
            state.conflict_head = ""
            state.head = repo.head()
            state.save(ws)
        elif repo.am_in_progress():
            repo("am", "--abort")
        if repo.head() != state.head or repo.is_dirty():
            repo("reset", "-q", "--hard", state.head)  # a run killed mid-way: redo
            repo("clean", "-q", "-fdx")
        if not state.preview and state.next_index == 0:
            state.preview = [c.to_json() for c in preview(repo, series.patches, new_version)]
            state.save(ws)
            write_bump_report(ws, stack, project, state, pinned_project(project, state),
                              stopped="applying the series (the run did not finish)")
        while state.next_index < len(series.patches):
            patch = series.patches[state.next_index]
            verdict, evidence = classify(repo, patch, new_version)
            if verdict == STILL_NEEDED:
                repo("am", "--quiet", "--no-3way", "--keep-cr",
                     "--committer-date-is-author-date", str(patch.path))
            elif verdict == CONFLICT:
                state.conflict_head = repo.head()
                state.conflict_evidence = evidence
                state.save(ws)
                try:
                    repo("am", "--quiet", "--3way", "--keep-cr",
                         "--committer-date-is-author-date", str(patch.path))
                except CommandError:
                    def fix(tree: str) -> str:
                        return (f"resolve the conflicts in {tree}, then "
                                f"`{cmd('--continue')}`; or drop the patch: "
                                f"`{cmd('--skip')}`; or "
                                f"`{cmd('--abort')}` to restore the previous pin and series")
                    # The report names the tree relative to the checkout: no machine path.
                    rel = os.path.relpath(repo.path, ws.root)
                    report = write_bump_report(
                        ws, stack, project, state, pinned_project(project, state),
                        stopped=f"{_conflict_message(state, patch, repo, rel)}. "
                                f"Next: {fix(rel)}.")
                    raise MaintenanceError(
                        _conflict_message(state, patch, repo, str(repo.path)),
                        where=state.stack, fix=fix(str(repo.path)),
                        detail="\n".join([f"{patch.name} stops the bump: {evidence[-1]}",
                                          *preview_lines(state),
                                          f"report (the evidence for each verdict): "
                                          f"{report.relative_to(ws.root)}"])) from None
                verdict = STILL_NEEDED
                evidence = [*evidence, MERGES_3WAY]
                state.conflict_head = ""
            _record(state, patch, verdict, evidence)
            state.next_index += 1
            state.head = repo.head()
            state.save(ws)
        state.phase = "finalize"
        state.save(ws)
    return _finalize(ws, stack, project, repo, state)


def _commits(repo: Git, rev_range: str) -> list[str]:
    """``<short sha> <subject>`` of each commit of ``rev_range``, oldest first."""
    out = repo("log", "--reverse", "--format=%h %s", rev_range, quiet=True)
    return [line for line in out.splitlines() if line.strip()]


def _range_diff(repo: Git) -> str:
    """``git range-diff`` of the series before and after; git refuses an empty range, so
    a side with no commit is written in range-diff's own notation."""
    before = _commits(repo, f"{BEFORE_BASE_REF}..{BEFORE_REF}")
    after = _commits(repo, f"{UPSTREAM_TAG}..HEAD")
    if before and after:
        return repo("range-diff", "--no-color", f"{BEFORE_BASE_REF}..{BEFORE_REF}",
                    f"{UPSTREAM_TAG}..HEAD", quiet=True)
    gone = [f"{i}:  {c.split(' ', 1)[0]} < -:  ------- {c.partition(' ')[2]}"
            for i, c in enumerate(before, 1)]
    new = [f"-:  ------- > {i}:  {c.split(' ', 1)[0]} {c.partition(' ')[2]}"
           for i, c in enumerate(after, 1)]
    return "\n".join([*gone, *new])


def _finalize(ws: Workspace, stack: Stack, project: Project, repo: Git,
              state: BumpState) -> BumpResult:
    d, _, decl_backup = _state_paths(ws, state)
    series_dir = Path(state.series_dir)
    # Everything that can fail without changing a file comes first: a failure here leaves
    # the declaration and series as they were, and --continue tries again.
    range_diff = _range_diff(repo)
    empty = not _commits(repo, f"{UPSTREAM_TAG}..HEAD")
    ships_published = empty or project.source == "wheel"
    if ships_published or project.wheels:
        # An empty series ships the published wheels unchanged (like a stack whose
        # FlashInfer is used as published); otherwise the old version's pins must go.
        wheels = (index_wheels(pinned_project(project, state), Version(state.new_version))
                  if ships_published else [])
        if ships_published and not wheels:
            raise MaintenanceError(
                f"{project.distribution} {state.new_version} has no wheel on the package "
                "index" + (" to ship as published: every patch left the series" if empty
                           else ""), where=f"{state.stack}/{state.project}",
                fix=f"`{command('bump', state.stack, state.project, '--abort')}`, or "
                    f"`{command('bump', state.stack, state.project, '--continue')}` once "
                    "upstream publishes its wheels")
        state.new_pin["wheels"] = wheels
        state.save(ws)
    new_project = pinned_project(project, state)
    refreshed = export_series(repo, series_dir, stack=stack.name, project=project.key)
    decl = declaration_with_pin(decl_backup.read_text(encoding="utf-8"), project, state,
                                 state.declaration)
    Path(state.declaration).write_text(decl, encoding="utf-8")
    stack = ws.stack(stack.name)
    project = stack.project(project.key)
    base = repo("rev-parse", UPSTREAM_TAG, quiet=True)
    reapply_series(ws, stack, project, repo, base)
    results = state.classifications()
    published = new_project.wheels if empty else ()
    undeclared, release_files = release_check(project)
    report = write_bump_report(ws, stack, project, state, new_project, results=results,
                               range_diff=range_diff, refreshed=refreshed,
                               published=published)
    changelog = write_changelog(ws, stack, project, state, results, report,
                                published=published)
    pre = ws.work_tree(stack, project, "pre-bump")
    shutil.rmtree(pre, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)
    return BumpResult(stack=stack.name, project=project.key, old_version=state.old_version,
                      new_version=state.new_version, classifications=results, report=report,
                      changelog=changelog, refresh=refreshed, range_diff=range_diff,
                      new_stack_created=state.created_stack, used_as_published=published,
                      undeclared_files=undeclared, release_files=release_files)


def bump_continue(ws: Workspace, stack_name: str, project_key: str, *,
                  skip: bool = False) -> BumpResult:
    """Resume a stopped bump; with ``skip``, drop the patch it stopped at (``git am --skip``)."""
    with ws.lock():
        state = BumpState.load(ws, stack_name, project_key)
        if state is None:
            raise MaintenanceError("no bump in progress", where=f"{stack_name}/{project_key}")
        return _resume(ws, state, skip=skip)


@dataclass(frozen=True, kw_only=True)
class AbortResult:
    stack: str
    project: str
    restored_version: str
    removed_stack: bool


def bump_abort(ws: Workspace, stack_name: str, project_key: str) -> AbortResult:
    """Undo a bump in progress: the previous fork tree, pin and series, byte for byte."""
    with ws.lock():
        state = BumpState.load(ws, stack_name, project_key)
        if state is None:
            raise MaintenanceError("no bump in progress", where=f"{stack_name}/{project_key}")
        d, series_backup, decl_backup = _state_paths(ws, state)
        if (d / "report.md").is_file():
            shutil.copyfile(d / "report.md", report_path(ws, state))
        else:
            report_path(ws, state).unlink(missing_ok=True)
        stack = ws.stack(state.stack) if Path(state.declaration).is_file() else None
        work = ws.trees_dir / state.stack / state.project
        pre = ws.trees_dir / state.stack / f"{state.project}@pre-bump"
        if pre.exists():
            shutil.rmtree(work, ignore_errors=True)
            os.replace(pre, work)
        if state.created_stack:
            remove_created_stack(ws, state)
            shutil.rmtree(work, ignore_errors=True)
            with contextlib.suppress(OSError):  # the stack's folder, when nothing else is left
                work.parent.rmdir()
        else:
            series_dir = Path(state.series_dir)
            shutil.rmtree(series_dir, ignore_errors=True)
            shutil.copytree(series_backup, series_dir)
            shutil.copyfile(decl_backup, state.declaration)
        shutil.rmtree(d, ignore_errors=True)
        del stack
        return AbortResult(stack=state.stack, project=state.project,
                           restored_version=state.old_version,
                           removed_stack=state.created_stack)

