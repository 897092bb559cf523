"""``bump``: re-pin one project and re-classify each patch on the new upstream; a conflict
stops like ``git am`` (``--continue``, ``--skip``, ``--abort``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sm120fork.declare import GitPin, Project, SdistPin, Stack, WheelPin, load_stack, pinned_for
from sm120fork.entry import relative
from sm120fork.errors import (
    CommandError,
    ConfigError,
    DirtyTreeError,
    MaintenanceError,
    SeriesError,
    SourceError,
    ToolkitError,
)
from sm120fork.fetch.index import download_pinned, find_sdist, find_wheels
from sm120fork.fetch.kinds import UPSTREAM_TAG, source_key, source_kind
from sm120fork.maintain.classify import classification, classify, preview
from sm120fork.maintain.pin import (
    check_declaration,
    check_released,
    closure,
    create_stack,
    create_stack_check,
    declaration_with_pin,
)
from sm120fork.maintain.preflight import (
    Release,
    check_layout,
    check_pins,
    missing_targets,
    requirements_on_stack,
    sdist_release,
    wheel_release,
)
from sm120fork.maintain.release import release_check, ships_wheels
from sm120fork.maintain.report import (
    preview_lines,
    report_file,
    report_path,
    write_bump_report,
    write_changelog,
)
from sm120fork.maintain.state import (
    CHECK_PASSES,
    CONFLICT,
    DROPPED_BY_HAND,
    MERGED_3WAY,
    MERGED_FAILS_CHECK,
    MERGED_UNCHECKED,
    RESOLVED,
    STILL_NEEDED,
    TARGET_MISSING,
    BumpState,
    Classification,
    NewPin,
    journal,
    restore,
    stage,
)
from sm120fork.patch.check import check_tree
from sm120fork.patch.refresh import (
    FORMAT_PATCH,
    RefreshResult,
    export_series,
    note_written,
)
from sm120fork.patch.series import Patch, Series, match_upstream, parse_patch
from sm120fork.patch.tree import (
    apply_recorded,
    keep_local_work_hint,
    local_work,
    prepare_tree,
    read_state,
)
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import to_remake
from sm120fork.util.files import atomic_write_text, scratch_prefix
from sm120fork.util.git import Git
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")
_SHA1 = re.compile(r"[0-9a-f]{40}")
_CONFLICT_MARK = re.compile(r"^(<<<<<<<|>>>>>>>) ", re.MULTILINE)
#: The old pin's fork tree: beside the tree while the bump runs, then in its folder.
_PRE = "pre-bump"
BEFORE_REF = "refs/sm120fork/before-bump"
BEFORE_BASE_REF = "refs/sm120fork/before-bump-base"


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
    new_stack_created: bool
    #: The published wheels the stack now ships unchanged: the series ended empty.
    used_as_published: tuple[WheelPin, ...] = ()
    #: ``maintain.release.release_check`` of the new pin.
    undeclared_files: tuple[str, ...] = ()
    release_files: str = ""
    #: The coordinated projects with patches bumped with it: key -> their verdicts.
    companions: dict[str, tuple[Classification, ...]] = dataclasses.field(
        default_factory=dict)
    #: ``standing.to_remake`` of the stack.
    remake: tuple[str, ...] = ()
    #: Every other pin the bump moved, and why (a line each).
    moves: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class BumpRequest:
    """The bump as asked (``coordinated_with``: the project whose bump moves this one), and
    the command that asks it (no revision: ``--continue``'s)."""

    stack: str
    project: str
    revision: str
    allow_downgrade: bool = False
    new_stack: str | None = None
    version: str | None = None
    git_commit: str | None = None
    coordinated_with: str = ""
    moved_by: dict[str, str] = dataclasses.field(default_factory=dict)

    def command(self, *, downgrade: bool) -> str:
        return command("bump", self.stack, self.project,
                       *([self.revision] if self.revision else []),
                       *(["--new-stack", self.new_stack] if self.new_stack else []),
                       *(["--version", self.version] if self.version else []),
                       *(["--git-commit", self.git_commit] if self.git_commit else []),
                       *(["--allow-downgrade"] if downgrade else []))


def bump(resolved: ResolvedStack, project_key: str, revision: str, *,
         allow_downgrade: bool = False, new_stack: str | None = None,
         version: str | None = None, git_commit: str | None = None) -> BumpResult:
    """Re-pin ``project_key`` of the stack to ``revision`` (a version or a git SHA),
    with the projects the new release pins moved with it; checked before a file is
    written, then journaled so that ``--continue`` or ``--abort`` recovers any stop."""
    with resolved.ws.lock():
        return _bump(resolved, BumpRequest(
            stack=resolved.name, project=project_key, revision=revision,
            allow_downgrade=allow_downgrade, new_stack=new_stack, version=version,
            git_commit=git_commit))


def _bump(resolved: ResolvedStack, req: BumpRequest) -> BumpResult:
    ws = resolved.ws
    pending = BumpState.load(ws, req.new_stack or req.stack, req.project)
    if pending is not None:
        pinned_commit = pending.new_pin.git.commit if pending.new_pin.git else None
        if (req.version or req.revision) not in (pending.new_version, pinned_commit):
            raise MaintenanceError(
                f"a bump to {pending.new_version} is in progress",
                where=f"{pending.stack}/{req.project}",
                fix="finish it with --continue or undo it with --abort")
        return _resume(ws, pending)
    stack = resolved.stack
    project = stack.project(req.project)
    new_version, commit = _target(req, project)
    # A new stack holds the project and those it requires (what create_stack copies).
    scope = stack if not req.new_stack else dataclasses.replace(
        stack, projects=tuple(closure(stack, project)))
    _preflight(ws, req, stack, scope, project, Version(new_version), commit)
    new_pin, release = _new_pin(ws, req, project, Version(new_version), commit)
    companion_bumps: dict[str, str] = {}
    moves = dict(req.moved_by)
    if release is not None:  # the new release's own facts, before a file is written
        companions, companion_bumps, found = _companions(resolved, scope, project, new_version,
                                                         release)
        moves.update(found)
        missing = missing_targets(project, resolved.series[project.key].patches, release)
        new_pin = dataclasses.replace(
            new_pin, companions=companions,
            upstream_requires=tuple(requirements_on_stack(scope, project, release)),
            layout=check_layout(list(ws.stacks().values()), stack, project, new_version,
                                release, missing))
    stage("pre-flight")
    state = BumpState(
        stack=req.new_stack or req.stack, project=project.key, old_version=project.version,
        new_version=new_version, new_pin=new_pin, created_stack=bool(req.new_stack),
        declaration=str(ws.forks_dir / f"{req.new_stack or req.stack}.toml"),
        series_dir=str(ws.root / "patches" / req.new_stack / project.key if req.new_stack
                       else ws.series_dir(project)),
        results=[], source_stack=stack.name,
        companion_bumps=companion_bumps, coordinated_with=req.coordinated_with,
        moves=moves, command=req.command(downgrade=req.allow_downgrade))
    _journal(ws, state, stack)
    state.save(ws)  # from here on, --abort restores every file from the journal
    stage("state saved")
    return _resume(ws, state)


def _target(req: BumpRequest, project: Project) -> tuple[str, GitPin | None]:
    """The version the bump pins, and the git commit when the revision is one."""
    new_version, commit = req.version or req.revision, None
    if _SHA1.fullmatch(req.revision):
        if not req.version:
            raise MaintenanceError("bumping to a git commit needs --version",
                                   fix="pass the PEP 440 version of that commit")
        commit = GitPin(url=project.git_pin.url, tag="", commit=req.revision)
    try:
        new = Version(new_version)
    except InvalidVersion:
        raise ConfigError(f"{new_version!r} is neither a PEP 440 version nor a 40-hex "
                          "git commit SHA", where="bump") from None
    if new.local is not None:
        raise ConfigError("give the upstream version, without a local label", where="bump")
    old = Version(project.version)
    if new == old and commit is None:
        raise MaintenanceError(f"{project.key} is already pinned to {project.version}",
                               where=req.stack)
    if new < old and not req.allow_downgrade:
        raise MaintenanceError(f"{new_version} is older than the pinned {project.version}",
                               where=f"{req.stack}/{project.key}",
                               fix=f"if you mean it: `{req.command(downgrade=True)}`")
    return new_version, commit


def _preflight(ws: Workspace, req: BumpRequest, stack: Stack, scope: Stack,
               project: Project, new: Version, commit: GitPin | None) -> None:
    """Before any download: the version exists, the other pins accept it; no local work."""
    if commit is None:
        with contextlib.suppress(SourceError):  # an index it cannot read: said where it is read
            check_released(project, new, f"{stack.name}/{project.key}")
    if not req.coordinated_with:
        check_pins(scope, project, str(new))
    if req.new_stack:
        create_stack_check(ws, req.new_stack)
    elif why := local_work(ws, stack, project):
        work = ws.work_tree(stack, project)
        raise DirtyTreeError(f"the fork work tree has local work: {why}", where=str(work),
                             fix=keep_local_work_hint(work, why, stack, project))


def _new_pin(ws: Workspace, req: BumpRequest, project: Project, new: Version,
             commit: GitPin | None) -> tuple[NewPin, Release | None]:
    """The new pin, and the new release's own facts (None for a git commit)."""
    if commit is not None:  # a git commit: pin that version's sdist when the index has one
        try:
            listed = find_sdist(project, new)
            sdist_pin = SdistPin(filename=listed.filename, sha256=listed.sha256)
        except SourceError:  # an unreleased commit: the sdist pin stays (unused by git)
            sdist_pin = project.sdist_pin
        return NewPin(source="git", git=commit, sdist=sdist_pin), None
    found = None
    if not source_kind(project.source).ships_wheels:
        try:
            found = find_sdist(project, new)
        except SourceError:  # a release with neither sdist nor wheels is refused
            if not find_wheels(project, new):
                raise
    if found is None:
        # The published wheels are the input (a release without an sdist, as SGLang
        # publishes since 0.5.11, switches an sdist source to them).
        pin = _wheel_pin(project, str(new), req.git_commit)
        wheel = download_pinned(dataclasses.replace(project, version=str(new)),
                                (pin.wheels or ())[0], ws.wheel_cache)
        return pin, wheel_release(wheel)
    sdist = download_pinned(dataclasses.replace(project, version=str(new)), SdistPin(
        filename=found.filename, sha256=found.sha256, url=found.url), ws.sdist_cache)
    release = sdist_release(sdist)
    recorded = req.git_commit or release.commit
    if not recorded:
        raise MaintenanceError(
            f"the git commit of {project.distribution} {new} is unknown",
            fix="pass --git-commit SHA (the sdist records none and the upstream "
                "repository is not consulted)")
    tag = project.git_pin.tag
    said = ("commit given with --git-commit" if req.git_commit else
            "commit recorded in the sdist's own build metadata")
    git = _unverified(project, recorded, tag.replace(project.version, str(new))
                      if project.version in tag else f"v{new}", said)
    return NewPin(source=project.source, git=git,
                  sdist=SdistPin(filename=found.filename, sha256=found.sha256)), release


def _journal(ws: Workspace, state: BumpState, stack: Stack) -> None:
    files = [Path(state.declaration), report_path(ws, state),
             ws.root / "patches" / state.stack / "CHANGELOG.md",
             *(report_file(ws, state.stack, k, stack.project(k).version, v)
               for k, v in state.companion_bumps.items())]
    dirs = ([ws.root / "patches" / state.stack] if state.created_stack else
            [Path(state.series_dir),
             *(ws.series_dir(stack.project(k)) for k in state.companion_bumps)])
    state.before, state.journaled_dirs = journal(ws.root, files, dirs)
    shutil.rmtree(BumpState.directory(ws, state.stack, state.project), ignore_errors=True)


def _companions(resolved: ResolvedStack, stack: Stack, project: Project, new_version: str,
                release: Release) -> tuple[dict[str, NewPin], dict[str, str], dict[str, str]]:
    """The stack's projects whose pin the new release rejects, each moved to the one
    version it pins (``==X``; a requirement that names no one version is refused): (new
    ``wheel`` pins of those shipped as published; versions of those with patches, each a
    bump of its own that this one waits for; why each moves)."""
    pins: dict[str, NewPin] = {}
    bumps: dict[str, str] = {}
    moves: dict[str, str] = {}
    for req in release.requires:
        other = pinned_for(req, stack.projects)
        if other is None or other is project or req.specifier.contains(
                other.version, prereleases=True) or (
                req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if len(exact) != 1 or "*" in exact[0]:
            raise MaintenanceError(
                f"{project.distribution} requires {req}, which the stack's "
                f"{other.distribution} {other.version} does not satisfy and which names "
                "no one version to move it to", where=f"{stack.name}/{other.key}",
                fix=f"bump {other.key} to a release it accepts first")
        own = bool(resolved.series[other.key].patches) or not ships_wheels(other)
        if own:
            bumps[other.key] = exact[0]
        else:
            pins[other.key] = dataclasses.replace(_wheel_pin(other, exact[0], None),
                                                  version=exact[0])
        moves[other.key] = (f"{other.distribution} {other.version} -> {exact[0]} "
                            + ("with its series (a bump of its own)" if own else "(as published)")
                            + f": {project.distribution} {new_version} requires {req}")
    return pins, bumps, moves


def _wheel_pin(project: Project, new_version: str, git_commit: str | None) -> NewPin:
    """The pin of a ``wheel`` source at ``new_version`` (a git pin only when given)."""
    probe = dataclasses.replace(project, version=new_version, wheels=())
    wheels = find_wheels(probe, Version(new_version))
    if not wheels:
        check_released(project, Version(new_version), f"projects.{project.key}")
        raise MaintenanceError(
            f"{project.distribution} {new_version} has no wheel on the package index",
            where=f"projects.{project.key}", fix="check the version, or wait until upstream "
                                                 "publishes its wheels")
    git = (_unverified(project, git_commit, f"v{new_version}", "commit given with --git-commit")
           if git_commit else None)
    return NewPin(source="wheel", git=git, wheels=wheels)


def _unverified(project: Project, commit: str, tag: str, said: str) -> GitPin:
    """A git pin of ``commit`` that the upstream repository was not asked about."""
    return GitPin(url=project.git.url if project.git else "", tag=tag, commit=commit,
                  commit_verified=False,
                  note=f"{said}; not checked against the upstream repository")


#: A step of a bump: what it does to the checkout, given the stack as declared now.
_Step = Callable[[Workspace, BumpState, ResolvedStack], None]


def _resume(ws: Workspace, state: BumpState, *, skip: bool = False) -> BumpResult:
    """Run the bump's steps from the one it saved last (a step stopped inside is redone),
    each on the stack as declared when it starts, then write its result."""
    if skip and not state.conflict_head:
        raise MaintenanceError("no conflict to skip", where=f"{state.stack}/{state.project}",
                               fix=f"`{state.cmd('--continue')}` resumes the bump")
    steps: tuple[_Step, ...] = (_copy_stack, _keep_old_tree, _bump_companions, _new_tree,
                                functools.partial(_apply_series, skip=skip))
    for step in steps[state.step:]:
        step(ws, state, _declared(ws, state))
        state.step += 1
        state.save(ws)
    return _finalize(ws, state, _declared(ws, state))


def declared(ws: Workspace, name: str) -> ResolvedStack:
    """Stack ``name`` as its declaration is now (pins that disagree loaded, as a bump
    takes them): read again where a bump's step may have rewritten it."""
    return ResolvedStack.of(ws, load_stack(ws.forks_dir / f"{name}.toml", strict=False))


def _declared(ws: Workspace, state: BumpState) -> ResolvedStack:
    """The bump's stack as declared now (the stack it copies until ``--new-stack`` wrote
    its own)."""
    is_declared = Path(state.declaration).is_file()
    return declared(ws, state.stack if is_declared else state.source_stack)


def _copy_stack(ws: Workspace, state: BumpState, resolved: ResolvedStack) -> None:
    """The new stack's copy (``--new-stack``), written after the journal."""
    if state.created_stack and resolved.stack.name != state.stack:
        shutil.rmtree(ws.root / "patches" / state.stack, ignore_errors=True)  # a partial copy
        source = resolved.stack
        create_stack(ws, source, source.project(state.project), state.stack)
        stage("stack created")


def _keep_old_tree(ws: Workspace, state: BumpState, resolved: ResolvedStack) -> None:
    """The old pin's fork tree kept aside (``@pre-bump``) with its series."""
    d = BumpState.directory(ws, state.stack, state.project)
    stack = resolved.stack
    project = stack.project(state.project)
    pre = ws.work_tree(stack, project, _PRE)
    if not pre.exists():
        work = ws.work_tree(stack, project)
        if work.exists() and read_state(work) is None:  # this bump's unpack, stopped
            shutil.rmtree(work)  # (the pre-flight refused a tree with no state)
        old_tree = prepare_tree(ws, stack, project, patches=resolved.series[project.key].patches)
        shutil.rmtree(d / "series", ignore_errors=True)
        shutil.copytree(ws.series_dir(project), d / "series")
        os.replace(old_tree.path, pre)
        stage("old tree kept")


def _bump_companions(ws: Workspace, state: BumpState, resolved: ResolvedStack) -> None:
    """Bump each coordinated project with patches to the version the new release pins (a
    bump of its own: this bump's --continue goes on after it)."""
    for key, version in state.companion_bumps.items():
        pending = BumpState.load(ws, state.stack, key)
        # As declared now: a companion bumped before this one may have re-pinned it.
        now = _declared(ws, state)
        if pending is None and Version(now.stack.project(key).version) == Version(version):
            continue  # done (by this bump, or by hand)
        try:
            done = _resume(ws, pending) if pending is not None else _bump(now, BumpRequest(
                stack=state.stack, project=key, revision=version, allow_downgrade=True,
                coordinated_with=state.project,
                moved_by={key: state.moves[key]} if key in state.moves else {}))
        except MaintenanceError as exc:
            _then_resume(exc, key, state)
            raise
        state.companion_results[key] = list(done.classifications)
        state.save(ws)
        stage("companion bumped")


def _then_resume(exc: MaintenanceError, key: str, state: BumpState) -> None:
    """Add to a coordinated bump's stop the command that resumes the bump that moved it."""
    then = f"`{state.cmd('--continue')}` goes on with {state.project} {state.new_version}"
    exc.fix = f"{exc.fix}; once {key} is done, {then}" if exc.fix else then


def _new_tree(ws: Workspace, state: BumpState, resolved: ResolvedStack) -> None:
    """The fork tree at the new upstream, with the old series' commits fetched beside it."""
    stack = resolved.stack
    project = stack.project(state.project)
    repo = prepare_tree(ws, stack, state.pinned(project), patches=(), force=True).repo
    repo("fetch", "--quiet", "--no-tags", str(ws.work_tree(stack, project, _PRE)),
         f"+HEAD:{BEFORE_REF}", f"+refs/tags/{UPSTREAM_TAG}:{BEFORE_BASE_REF}")
    state.head = repo.head()
    state.save(ws)
    stage("new tree made")


@dataclass(frozen=True)
class _Series:
    """What applying the series works on (``series``: the one the bump started from)."""

    ws: Workspace
    state: BumpState
    project: Project
    repo: Git
    series: Series

    @property
    def patch(self) -> Patch:
        return self.series.patches[self.state.next_index]

    def done(self, verdict: str, evidence: list[str]) -> None:
        """Record the patch's verdict and go on to the next one."""
        state = self.state
        state.results.append(classification(self.patch, verdict, evidence))
        state.next_index += 1
        state.conflict_head = state.merged_head = ""
        state.failed_check = []
        state.head = self.repo.head()
        state.save(self.ws)


def _apply_series(ws: Workspace, state: BumpState, resolved: ResolvedStack, *,
                  skip: bool) -> None:
    """Classify and apply each patch in order, like ``git am``, going on from a stop."""
    if not state.head:  # killed while the new tree was unpacked
        _new_tree(ws, state, resolved)
    stack = resolved.stack
    project = stack.project(state.project)
    at = _Series(ws, state, project, Git(ws.work_tree(stack, project)), state.kept_series(ws))
    if state.conflict_head:
        _settle(at, skip=skip)
    _back_to(at.repo, state.head)
    if not state.preview and state.next_index == 0:
        state.preview = list(preview(at.repo, at.series.patches, Version(state.new_version)))
        state.save(ws)
        write_bump_report(ws, state, project,
                          stopped="applying the series (the run did not finish)")
        stage("classified")
    while state.next_index < len(at.series.patches):
        _apply_patch(at)
        stage("patch applied")


def _settle(at: _Series, *, skip: bool) -> None:
    """Record the patch whose conflict the bump met, as it is now: merged by git, resolved
    or mended by hand, or dropped (``skip``)."""
    repo, state, patch = at.repo, at.state, at.patch
    if skip:  # drop the patch: back where it started, like git am --skip
        _back_to(repo, state.conflict_head)
    if repo.am_in_progress():
        unmerged = repo("diff", "--name-only", "--diff-filter=U").split()
        marked = [f for f in sorted({*unmerged, *patch.files})
                  if (repo.path / f).is_file() and _CONFLICT_MARK.search(
                      (repo.path / f).read_text(errors="replace"))]
        if marked:
            raise MaintenanceError(
                f"patch {patch.name} still has conflict markers: {', '.join(marked)}",
                where=str(repo.path),
                fix=f"edit them, then `{at.state.cmd('--continue')}`; or drop the patch: "
                    f"`{at.state.cmd('--skip')}`; or `{at.state.cmd('--abort')}`")
        repo("add", "-A")
        if repo("diff", "--cached", "--name-only", "HEAD"):
            repo("am", "--continue")
        else:  # resolved to upstream's side: nothing left of the patch
            repo("am", "--skip")
    elif state.failed_check and repo.is_dirty():  # mended by hand after its check
        repo("add", "-A")
        repo("commit", "-q", "--amend", "--no-edit", "--no-verify")
    if repo.head() == state.merged_head:  # the 3-way merge, as it was
        at.done(STILL_NEEDED, [*state.conflict_evidence, _check_or_stop(at)])
    elif repo.head() != state.conflict_head:
        at.done(RESOLVED, _resolution(at))
    else:
        at.done(DROPPED_BY_HAND, [*state.conflict_evidence,
                                  "conflict resolved by dropping the patch (--skip)"])


def _apply_patch(at: _Series) -> None:
    """Apply the patch: exactly, or by a checked 3-way merge; a conflict stops the bump."""
    repo, state, patch = at.repo, at.state, at.patch
    verdict, evidence = classify(repo, patch, Version(state.new_version))
    if verdict == STILL_NEEDED:
        repo("am", "--quiet", "--no-3way", "--keep-cr", "--committer-date-is-author-date",
             str(patch.path))
    if verdict not in (CONFLICT, TARGET_MISSING):
        at.done(verdict, evidence)
    else:
        state.conflict_head = repo.head()
        state.conflict_evidence = evidence
        state.save(at.ws)
        try:
            repo("am", "--quiet", "--3way", "--keep-cr", "--committer-date-is-author-date",
                 str(patch.path))
        except CommandError:
            files = repo("diff", "--name-only", "--diff-filter=U").split()
            raise _stop(at, f"patch {patch.name} conflicts with {state.project} "
                        f"{state.new_version}{': ' + ', '.join(files) if files else ''}; the "
                        "fork tree {tree} stops at it with conflict markers in place",
                        "resolve the conflicts in {tree}, then",
                        [f"{patch.name} stops the bump: {evidence[-1]}"]) from None
        state.merged_head = repo.head()
        state.conflict_evidence = [*evidence, MERGED_3WAY]
        state.save(at.ws)
        _settle(at, skip=False)


def _resolution(at: _Series) -> list[str]:
    """The evidence for a hand resolution (HEAD), judged by its own header and checked
    while ``commit --amend`` still mends it (the series export at the end would refuse
    stale Fingerprint or Effect lines)."""
    repo = at.repo
    with tempfile.TemporaryDirectory(prefix="sm120fork-resolved-") as tmp:
        out = repo(*FORMAT_PATCH, "-o", tmp, "-1", "HEAD")
        try:
            judged = match_upstream(repo, parse_patch(Path(out.split()[0])), "HEAD")
        except SeriesError as exc:
            raise MaintenanceError(
                f"the resolution of {at.patch.name} (HEAD of the fork tree) cannot become a "
                f"patch: {exc.what}", where=str(repo.path),
                fix=f"make its message say what the resolved change does (a Fingerprint "
                    f"or Effect line names a file the change touches now, patches/"
                    f"README.md): `git -C {repo.path} commit --amend`, then "
                    f"`{at.state.cmd('--continue')}`") from None
    holds = judged.already_upstream
    if not holds:  # said now, not only in the report at the end
        log.warning("%s: the patch's effect does not hold on the resolved tree "
                    "(%s): review the resolution in %s", at.patch.name,
                    "; ".join(e for e in judged.evidence
                              if e.endswith(("absent", "ABSENT", "PRESENT"))), repo.path)
    checked = _check_or_stop(at)
    return [*at.state.conflict_evidence, "conflict resolved by hand in the fork tree",
            "the patch's effect holds on the resolved tree" if holds else
            "WARNING: the patch's effect does not hold on the resolved tree: review", checked]


def _check_or_stop(at: _Series) -> str:
    """Check the tree a merge or resolution made: its evidence line, or a stop (also when
    the check could not run: that is no verdict)."""
    state, patch = at.state, at.patch
    applied = [p for p, r in zip(at.series.patches, state.results, strict=False)
               if r.verdict in (STILL_NEEDED, RESOLVED)]
    state.conflict_evidence = [e for e in state.conflict_evidence
                               if not e.startswith(f"{MERGED_UNCHECKED}: ")]
    try:
        result = check_tree(at.repo.path, [*applied, patch], cache=at.ws.state_dir / "probe",
                            layout=state.new_pin.layout or at.project.layout)
    except ToolkitError as exc:
        state.conflict_evidence.append(f"{MERGED_UNCHECKED}: {exc.what}")
        fix = f" ({relative(exc.fix, at.ws.root)})" if exc.fix else ""
        raise _stop(at, f"patch {patch.name} is {MERGED_UNCHECKED}: {exc.what}",
                    f"make the check runnable{fix}, then", []) from exc
    if result.passed:
        return f"{CHECK_PASSES}: {result.summary}"
    state.failed_check = [*map(str, result.failures), f"check: {result.summary}"]
    first = result.failures[0]
    if (said := f"{MERGED_FAILS_CHECK}: {first}") not in state.conflict_evidence:
        state.conflict_evidence.append(said)
    raise _stop(at, f"patch {patch.name} is {MERGED_FAILS_CHECK}: {first.where}: "
                    f"{first.error} ({first.check})", "mend it in {tree}, then",
                state.failed_check)


def _stop(at: _Series, what: str, first: str, detail: list[str]) -> MaintenanceError:
    """The stop at the patch, saved and reported; ``{tree}`` in ``what`` and ``first``
    names the fork tree (in the report, relative: it names no machine path)."""
    at.state.save(at.ws)
    cmd = at.state.cmd
    fix = (f"{first} `{cmd('--continue')}`; or drop the patch: `{cmd('--skip')}`; or "
           f"`{cmd('--abort')}` to restore the previous pin and series")
    rel = os.path.relpath(at.repo.path, at.ws.root)
    report = write_bump_report(at.ws, at.state, at.project,
                               stopped=f"{what}. Next: {fix}.".replace("{tree}", rel))
    tree = str(at.repo.path)
    return MaintenanceError(what.replace("{tree}", tree), where=at.state.stack,
                            fix=fix.replace("{tree}", tree), detail="\n".join(
        [*detail, *preview_lines(at.state),
         f"report (the evidence for each verdict): {report.relative_to(at.ws.root)}"]))


def _back_to(repo: Git, head: str) -> None:
    """The fork tree back at ``head`` from wherever a killed run left it."""
    if repo.am_in_progress():
        repo("am", "--abort")
    if repo.head() != head or repo.is_dirty():
        repo("reset", "-q", "--hard", head)
        repo("clean", "-q", "-fdx")


def _commits(repo: Git, rev_range: str) -> list[str]:
    out = repo("log", "--reverse", "--format=%h %s", rev_range)
    return [line for line in out.splitlines() if line.strip()]


def _range_diff(repo: Git) -> str:
    """``git range-diff`` of the series before and after (an empty side, which git
    refuses, in its notation)."""
    before = _commits(repo, f"{BEFORE_BASE_REF}..{BEFORE_REF}")
    after = _commits(repo, f"{UPSTREAM_TAG}..HEAD")
    if before and after:
        return repo("range-diff", "--no-color", f"{BEFORE_BASE_REF}..{BEFORE_REF}",
                    f"{UPSTREAM_TAG}..HEAD")
    gone = [f"{i}:  {c.split(' ', 1)[0]} < -:  ------- {c.partition(' ')[2]}"
            for i, c in enumerate(before, 1)]
    new = [f"-:  ------- > {i}:  {c.split(' ', 1)[0]} {c.partition(' ')[2]}"
           for i, c in enumerate(after, 1)]
    return "\n".join([*gone, *new])


def _finalize(ws: Workspace, state: BumpState, resolved: ResolvedStack) -> BumpResult:
    """Write series, declaration, rebuilt tree, report and changelog; then close."""
    stack = resolved.stack
    project = stack.project(state.project)
    repo = Git(ws.work_tree(stack, project))
    _back_to(repo, state.head)  # as a run stopped in this step left it
    series_dir = Path(state.series_dir)
    # What can fail comes before the first write: --continue tries again.
    range_diff = _range_diff(repo)
    empty = not _commits(repo, f"{UPSTREAM_TAG}..HEAD")
    if empty or source_kind(project.source).ships_wheels:  # it ships the published wheels
        wheels = find_wheels(state.pinned(project), Version(state.new_version))
        if not wheels:
            raise MaintenanceError(
                f"{project.distribution} {state.new_version} has no wheel on the package "
                "index" + (" to ship as published: every patch left the series" if empty
                           else ""), where=f"{state.stack}/{state.project}",
                fix=f"`{state.cmd('--abort')}`, or `{state.cmd('--continue')}` once "
                    "upstream publishes its wheels")
        state.new_pin = dataclasses.replace(state.new_pin, wheels=wheels)
    elif project.wheels:  # built from source: the old version's published wheels go
        state.new_pin = dataclasses.replace(state.new_pin, wheels=())
    state.save(ws)
    # Edits the declaration as it is now: a hand fix made while stopped stays.
    declaration = Path(state.declaration)
    decl = declaration_with_pin(declaration.read_text(encoding="utf-8"), project, state,
                                state.declaration,
                                description=_description(resolved, project, state, empty)
                                if state.created_stack else "")
    pinned = check_declaration(declaration, decl, fix=state.cmd("--abort"),
                               pins=not state.coordinated_with)
    refreshed = export_series(repo, series_dir, stack=stack.name, project=project.key)
    note_written(ws, refreshed.paths)
    stage("series exported")
    atomic_write_text(declaration, decl)
    stage("declaration written")
    stack, project = pinned, pinned.project(project.key)
    base = repo("rev-parse", UPSTREAM_TAG)
    apply_recorded(repo, refreshed.series, source=source_key(project), base=base,
                   stack=stack.name, project=project.key)
    stage("tree rebuilt")
    results = tuple(state.results)
    published = (state.new_pin.wheels or ()) if empty else ()
    undeclared, release_files = release_check(project)
    try:
        remake = to_remake(ResolvedStack.of(ws, stack))
    except ToolkitError as exc:  # a malformed Verified-By: say so, the bump is done
        remake = [f"claims not judged: {exc.message}"]
    report = write_bump_report(ws, state, project, results=results, range_diff=range_diff,
                               refreshed=refreshed, published=published, remake=remake)
    stage("report written")
    changelog = write_changelog(ws, state, project, report, published=published)
    stage("changelog written")
    _close(ws, state)
    return BumpResult(stack=stack.name, project=project.key, old_version=state.old_version,
                      new_version=state.new_version, classifications=results, report=report,
                      changelog=changelog, refresh=refreshed,
                      new_stack_created=state.created_stack, used_as_published=published,
                      undeclared_files=undeclared, release_files=release_files,
                      companions={k: tuple(v) for k, v in state.companion_results.items()},
                      remake=tuple(remake), moves=tuple(state.moves.values()))


def _close(ws: Workspace, state: BumpState) -> None:
    """The bump's end in renames: the old tree into the bump's folder, that folder out of
    ``.forks/bump`` to scratch, removed last; ``--abort`` never meets a half tree."""
    d = BumpState.directory(ws, state.stack, state.project)
    pre = ws.trees_dir / state.stack / f"{state.project}@{_PRE}"
    if pre.exists():
        os.replace(pre, d / _PRE)
    stage("old tree set aside")
    done = Path(tempfile.mkdtemp(prefix=scratch_prefix(_done_label(state.stack,
                                                                   state.project)),
                                 dir=ws.state_dir))
    os.replace(d, done / "bump")
    stage("finished")
    shutil.rmtree(done, ignore_errors=True)


def _done_label(stack: str, project: str) -> str:
    return f"bump-done-{stack}--{project}"


def finished_here(ws: Workspace, stack: str, project: str) -> bool:
    """Whether that bump finished and was stopped while cleaning up."""
    return any(ws.state_dir.glob(f"{scratch_prefix(_done_label(stack, project))}*"))


def _description(resolved: ResolvedStack, project: Project, state: BumpState, empty: bool) -> str:
    companions = state.new_pin.companions
    parts = []
    for p in resolved.stack.projects:
        if p.key == project.key:
            version, published = state.new_version, empty
        elif p.key in companions:
            version, published = companions[p.key].version, True
        else:
            version, published = p.version, not resolved.series[p.key].patches
        parts.append(f"{p.distribution} {version}" + (" (as published)" if published else ""))
    return " + ".join(parts) + ", SM120/SM121 enabled"


def bump_continue(ws: Workspace, stack_name: str, project_key: str, *,
                  skip: bool = False) -> BumpResult:
    """Resume a stopped bump; ``skip`` drops the patch it stopped at."""
    with ws.lock():
        state = BumpState.load(ws, stack_name, project_key)
        if state is None:
            raise MaintenanceError("no bump in progress", where=f"{stack_name}/{project_key}")
        mover = (BumpState.load(ws, stack_name, state.coordinated_with)
                 if state.coordinated_with else None)
        try:
            return _resume(ws, state, skip=skip)
        except MaintenanceError as exc:  # resumed on its own: still say what comes next
            if mover is not None:
                _then_resume(exc, project_key, mover)
            raise


@dataclass(frozen=True, kw_only=True)
class AbortResult:
    stack: str
    project: str
    restored_version: str
    removed_stack: bool
    tree: str = ""


def bump_abort(ws: Workspace, stack_name: str, project_key: str) -> AbortResult:
    """Undo a bump from any step: the old fork tree back, every file it may have written
    restored from the journal (the report last); loads no stack."""
    with ws.lock():
        return _abort(ws, stack_name, project_key)


def _abort(ws: Workspace, stack_name: str, project_key: str) -> AbortResult:
    state = BumpState.load(ws, stack_name, project_key)
    if state is None:
        raise MaintenanceError("no bump in progress", where=f"{stack_name}/{project_key}")
    for key in state.companion_bumps:  # a coordinated bump it started, stopped part-way
        if BumpState.load(ws, state.stack, key) is not None:
            _abort(ws, state.stack, key)
    d = BumpState.directory(ws, stack_name, project_key)
    # The old pin's fork tree back, in renames (interrupted, it is whole somewhere).
    trees, work = ws.trees_dir / state.stack, ws.trees_dir / state.stack / state.project
    if kept := [p for p in (trees / f"{state.project}@{_PRE}", d / _PRE) if p.exists()]:
        scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix("bump-abort"), dir=ws.state_dir))
        if work.exists():
            os.replace(work, scratch / "tree")
        os.replace(kept[0], work)
        shutil.rmtree(scratch)
    if state.created_stack and trees.exists():  # every fork tree of the new stack
        # Tens of thousands of files (FlashInfer's sdist): minutes on a slow disk.
        log.info("removing the fork trees of stack %s (%s)", state.stack,
                 trees.relative_to(ws.root).as_posix())
        shutil.rmtree(trees, ignore_errors=True)
    restore(ws.root, state.before, state.journaled_dirs,
            last=[report_path(ws, state).relative_to(ws.root).as_posix()])
    # A finished coordinated bump left its tree at the new pin: checked too.
    tree = "" if state.created_stack else "; ".join(
        _checked_tree(_declared(ws, state), key)
        for key in (state.project, *state.companion_bumps))
    shutil.rmtree(d, ignore_errors=True)
    return AbortResult(stack=state.stack, project=state.project,
                       restored_version=state.old_version,
                       removed_stack=state.created_stack, tree=tree)


def _checked_tree(resolved: ResolvedStack, key: str) -> str:
    """The fork tree after an abort, checked against the pin and series put back, else
    made again from them; says which."""
    ws, stack, project = resolved.ws, resolved.stack, resolved.stack.project(key)
    if not ws.work_tree(stack, project).exists():
        return f"{key}: no fork tree (`{command('build', '--stack', stack.name)}` makes it)"
    tree = prepare_tree(ws, stack, project, patches=resolved.series[key].patches, force=True)
    return (f"{key}: fork tree {'checked' if tree.reused else 'made again'} at "
            f"{project.version} and its series")
