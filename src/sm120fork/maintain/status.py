"""``status``: every patch of every stack against its pin (applies, upstream, wheel)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120fork import manifest as manifest_file
from sm120fork.declare import Project, Stack, coordinated_pin_problems
from sm120fork.errors import ToolkitError
from sm120fork.fetch.kinds import source_key, source_kind
from sm120fork.maintain.release import release_check
from sm120fork.maintain.state import BumpState
from sm120fork.manifest import UNCHECKED, Manifest
from sm120fork.patch.series import Patch, match_upstream
from sm120fork.patch.tree import check_series, prepare_tree, read_state
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import Standing, claim_standings, stack_evidence, stack_records
from sm120fork.util.git import Git
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")


def _at_pin(ws: Workspace, stack: Stack, project: Project, variant: str = "") -> bool:
    work = ws.work_tree(stack, project, variant)
    state = read_state(work) if work.exists() else None
    return state is not None and state.source == source_key(project)


def pinned_upstream(ws: Workspace, stack: Stack, project: Project) -> Git:
    """A git repo whose ``upstream`` tag is the pinned upstream: the fork tree when at
    this pin (only the tag is read), else a pristine ``@upstream`` tree."""
    if _at_pin(ws, stack, project):
        return Git(ws.work_tree(stack, project))
    return prepare_tree(ws, stack, project, patches=(), variant="upstream", force=True).repo


@dataclass(frozen=True, kw_only=True)
class PatchStatus:
    patch: str
    subject: str
    applies: str
    forwarded: str
    applied_upstream: str
    bug_upstream: str
    fingerprint_upstream: str
    effect_upstream: str
    wheel: str


@dataclass(frozen=True, kw_only=True)
class ProjectStatus:
    stack: str
    default: bool
    project: str
    version: str
    source: str
    series: str
    patches: tuple[PatchStatus, ...]
    bump_in_progress: str = ""
    error: str = ""
    #: ``maintain.release.release_check`` of the pin.
    undeclared_files: tuple[str, ...] = ()
    release_files: str = ""
    #: Why the patches were not checked (``--no-fetch`` and the upstream is not here).
    not_checked: str = ""
    #: Where the stack's pins do not satisfy this project's ``upstream_requires``.
    pins_disagree: tuple[str, ...] = ()
    #: The stack's records that tested this project, and its patches' claims, judged.
    evidence: tuple[Standing, ...] = ()
    claims: tuple[Standing, ...] = ()


def _wheel_for(manifest: Manifest | None, stack: Stack, project: Project,
               patch: Patch) -> str:
    entry = manifest.first(project.key) if manifest and manifest.stack == stack.name else None
    built = entry.patch(patch.name) if entry else None
    if entry is None or built is None:
        return "-"
    return entry.wheel + ("" if built.sha256 == patch.sha256 else " (patch changed since)") + (
        " (built unchecked)" if entry.check.startswith(UNCHECKED) else "")


def project_status(today: ResolvedStack, project: Project, manifest: Manifest | None, *,
                   fetch: bool = True) -> ProjectStatus:
    ws, stack = today.ws, today.stack
    pending = BumpState.load(ws, stack.name, project.key)
    undeclared, release = release_check(project)
    base = ProjectStatus(
        stack=stack.name, default=stack.default, project=project.key, version=project.version,
        source=project.source, series=project.series, patches=(),
        bump_in_progress=f"to {pending.new_version}" if pending else "",
        undeclared_files=undeclared, release_files=release, pins_disagree=tuple(
            e.message for e in coordinated_pin_problems(stack.path, project, stack.projects)))
    try:
        series = today.series[project.key]
        if not series.patches:  # nothing to check against the pin: fetch nothing
            return base
        # What status must download to check the patches (none once a tree is here).
        missing = [] if _at_pin(ws, stack, project) or _at_pin(
            ws, stack, project, "upstream") else source_kind(project.source).missing(
            project, ws)
        if missing and not fetch:
            return dataclasses.replace(
                base, not_checked=f"not checked: the pinned upstream is not here "
                                  f"({', '.join(missing)}); without --no-fetch status "
                                  "downloads it")
        if missing:
            log.info("status: %s/%s was never built here: fetching %s to check its %d "
                     "patch(es) against the pin (once; --no-fetch skips it)", stack.name,
                     project.key, ", ".join(missing), len(series.patches))
        repo = pinned_upstream(ws, stack, project)
    except ToolkitError as exc:  # a bad series, an unreachable pin: a row, keep going
        return dataclasses.replace(base, error=exc.message)
    failures = check_series(repo, series)
    failed_at = series.names().index(failures[0].patch) if failures else len(series.patches)
    rows: list[PatchStatus] = []
    for i, p in enumerate(series.patches):
        applies = ("yes" if i < failed_at else "not checked" if i > failed_at
                   else f"NO: {failures[0].file}, {failures[0].hunk}")
        match = match_upstream(repo, p)
        n, total = match.fingerprints_present, len(p.fingerprints)
        fp = "absent" if n == 0 else ("PRESENT" if n == total else f"partly ({n}/{total})")
        effect = "-" if match.effect is None else ("present" if match.effect else "absent")
        rows.append(PatchStatus(
            patch=p.name, subject=p.subject, applies=applies, forwarded=p.field("Forwarded"),
            applied_upstream=p.applied_upstream, bug_upstream=p.field("Bug-Upstream"),
            fingerprint_upstream=fp, effect_upstream=effect,
            wheel=_wheel_for(manifest, stack, project, p)))
    return dataclasses.replace(base, patches=tuple(rows))


def status(ws: Workspace, stacks: Sequence[Stack] = (), wheels_dir: Path | None = None, *,
           fetch: bool = True) -> list[ProjectStatus]:
    """The status of every project of ``stacks`` (default: every stack); the wheel column
    from its manifest (``wheels_dir``: one published elsewhere)."""
    stacks = stacks or sorted(ws.stacks().values(), key=lambda s: (not s.default, s.name))
    given = manifest_file.read(wheels_dir) if wheels_dir is not None else None
    todays = {s.name: ResolvedStack.of(ws, s, wheels_dir=wheels_dir) for s in stacks}
    with ws.lock():
        found = [project_status(todays[s.name], p, given or todays[s.name].built, fetch=fetch)
                 for s in stacks for p in s.projects]
    evidence = {s.name: stack_standings(todays[s.name]) for s in stacks}
    return [dataclasses.replace(ps, evidence=evidence[ps.stack][0].get(ps.project, ()),
                                claims=evidence[ps.stack][1].get(ps.project, ()))
            for ps in found]


def stack_standings(today: ResolvedStack
                    ) -> tuple[dict[str, tuple[Standing, ...]], dict[str, tuple[Standing, ...]]]:
    """project -> its stack's records that tested it, and project -> its patches' claims,
    each current or stale (nothing runs)."""
    stack = today.stack
    try:
        records = stack_evidence(today)
        tested = {rel.as_posix(): rec.tested.projects
                  for rel, rec in stack_records(today.ws, stack.name)}
        claims = claim_standings(today)
    except ToolkitError as exc:  # a broken record or header: one row, keep going
        broken = Standing(name=f"reports/{stack.name}", kind="record", state="stale",
                          reasons=(exc.message,))
        return {p.key: (broken,) for p in stack.projects}, {}
    by_project = {p.key: tuple(r for r in records if p.key in tested.get(r.name, (p.key,)))
                  for p in stack.projects}
    by_claim = {p.key: tuple(c for c in claims if c.name.startswith(f"{p.series}/"))
                for p in stack.projects}
    return by_project, by_claim

