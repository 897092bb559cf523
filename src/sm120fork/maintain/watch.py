"""``watch``: what each upstream release newer than a stack's pins will cost: each bumped
in a scratch copy of the checkout (a stop is skipped so later patches are judged too),
written as ``reports/watch/<stack>.json`` and ``.md``."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sm120fork.declare import Project, Stack, pinned_for
from sm120fork.entry import relative
from sm120fork.errors import ConfigError, MaintenanceError, ToolkitError
from sm120fork.fetch.index import project_page
from sm120fork.maintain.bump import BumpResult, bump, bump_continue, declared
from sm120fork.maintain.preflight import pins_refusing
from sm120fork.maintain.report import verdict_counts
from sm120fork.maintain.state import (
    CONFLICT,
    DROPPED_BY_HAND,
    MERGED_3WAY,
    MERGED_FAILS_CHECK,
    MERGED_UNCHECKED,
    STILL_NEEDED,
    TARGET_MISSING,
    UPSTREAMED,
    BumpState,
    Classification,
    today,
)
from sm120fork.standing import unbacked_claims
from sm120fork.util.files import atomic_write_text, scratch_prefix
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

APPLIES = "applies"
MERGES = "merges (3-way), passes its check"
CONFLICTS = "conflicts"
UPSTREAM_HAS_IT = "upstream has it"


@dataclass(frozen=True, kw_only=True)
class PatchVerdict:
    project: str
    patch: str
    verdict: str
    bump_verdict: str
    evidence: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Step:
    run: str
    why: str


@dataclass(frozen=True, kw_only=True)
class ReleaseWatch:
    version: str
    #: "bumps", "stops" (at conflicts), "refused" (``error`` says why), "failed" (not
    #: judged: a download failed), "carried" (another stack already pins it).
    outcome: str
    new_stack: str = ""
    patches: tuple[PatchVerdict, ...] = ()
    moves: tuple[str, ...] = ()
    #: Each claim whose record must be made again: (claim, why).
    claims: tuple[tuple[str, str], ...] = ()
    steps: tuple[Step, ...] = ()
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ProjectWatch:
    project: str
    distribution: str
    pinned: str
    #: Every release on the index newer than the pin, newest first; the newest ``limit``
    #: of them bumped in scratch.
    newer: tuple[str, ...] = ()
    releases: tuple[ReleaseWatch, ...] = ()
    #: Why the index could not be read.
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class StackWatch:
    stack: str
    date: str
    limit: int
    projects: tuple[ProjectWatch, ...]


@contextmanager
def scratch_checkout(ws: Workspace, cache: Path) -> Iterator[Workspace]:
    """A copy of the checkout's declarations, series, records and manifests, whose download
    cache is ``cache``."""
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("watch")) as tmp:
        root = Path(tmp) / "checkout"
        root.mkdir()
        for top in ("forks", "patches", "reports"):
            if (ws.root / top).is_dir():
                shutil.copytree(ws.root / top, root / top, symlinks=True)
        for manifest in sorted(ws.wheels_dir.glob("*/manifest.json")):
            (root / manifest.relative_to(ws.root)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(manifest, root / manifest.relative_to(ws.root))
        scratch = Workspace(root)
        scratch.state_dir.mkdir()
        (scratch.state_dir / "cache").symlink_to(cache)
        yield scratch


def _verdict(c: Classification) -> str:
    if c.verdict in UPSTREAMED:
        return UPSTREAM_HAS_IT
    for said in (MERGED_FAILS_CHECK, MERGED_UNCHECKED):  # merged, then dropped (--skip)
        if line := next((e for e in c.evidence if e.startswith(f"{said}: ")), ""):
            return line if said == MERGED_UNCHECKED else said
    if c.verdict in (CONFLICT, TARGET_MISSING, DROPPED_BY_HAND):
        return CONFLICTS
    if c.verdict == STILL_NEEDED:
        return MERGES if MERGED_3WAY in c.evidence else APPLIES
    return c.verdict


def _verdicts(project: str, rows: Sequence[Classification]) -> list[PatchVerdict]:
    return [PatchVerdict(project=project, patch=c.patch, verdict=_verdict(c),
                         bump_verdict=c.verdict, evidence=c.evidence) for c in rows]


def _moves(before: Stack, after: Stack, project: str) -> list[str]:
    moved = after.project(project)
    out = []
    for old in before.projects:
        new = next((p for p in after.projects if p.key == old.key), None)
        if old.key == project or new is None or new.version == old.version:
            continue
        why = next((f" ({moved.distribution} {moved.version} requires {req})"
                    for req in moved.upstream_requires
                    if pinned_for(req, after.projects) is new), "")
        out.append(f"{old.key} {old.version} -> {new.version}{why}")
    return out


def _to_end(ws: Workspace, stack: str, project: str, start: Callable[[], BumpResult]) -> tuple[
        BumpResult, list[tuple[str, str, str]], dict[str, tuple[Classification, ...]]]:
    """Run ``start`` to the end of ``project``'s bump, skipping each stop at a patch (its
    stops: project, patch, what it takes; the coordinated bumps' verdicts); any other stop
    is raised."""
    call, seen = start, set()
    stops: list[tuple[str, str, str]] = []
    companions: dict[str, tuple[Classification, ...]] = {}
    while True:
        try:
            result = call()
        except ToolkitError:
            states = [s for p in BumpState.pending(ws, stack)
                      if (s := BumpState.load(ws, stack, p))]
            state = next((s for s in states if s.coordinated_with), states[0] if states else None)
            if state is None or not state.conflict_head or (
                    state.project, state.next_index) in seen:
                raise
            seen.add((state.project, state.next_index))
            patch = state.kept_series(ws).patches[state.next_index]
            unchecked = [e for e in state.conflict_evidence
                         if e.startswith(f"{MERGED_UNCHECKED}: ")]
            stops.append((state.project, patch.name, (
                f"mended in its fork tree (it merged, but {state.failed_check[0]})"
                if state.failed_check else f"checked ({unchecked[0]})" if unchecked
                else "resolved in its fork tree")))
            call = functools.partial(bump_continue, ws, stack, state.project, skip=True)
            continue
        if result.project == project:
            return result, stops, companions
        companions[result.project] = result.classifications
        call = functools.partial(bump_continue, ws, stack, project)


def watch_release(ws: Workspace, stack: Stack, project: Project, version: Version,
                  cache: Path) -> ReleaseWatch:
    """Bump ``project`` to ``version`` in a scratch copy of the checkout: in place, or into
    a new stack when the stack's other pins refuse it."""
    refusing = pins_refusing(stack, project, str(version))
    new_stack = f"{project.key}-{version}" if refusing else ""
    if new_stack in ws.stacks():
        return ReleaseWatch(version=str(version), outcome="carried", new_stack=new_stack,
                            error=f"stack {new_stack} carries it")
    target = new_stack or stack.name
    args = [stack.name, project.key, str(version), *(["--new-stack", new_stack] * bool(new_stack))]
    with scratch_checkout(ws, cache) as scratch:
        try:
            result, stops, more = _to_end(scratch, target, project.key, lambda: bump(
                declared(scratch, stack.name), project.key, str(version),
                new_stack=new_stack or None))
        except ToolkitError as exc:
            return ReleaseWatch(
                version=str(version), new_stack=new_stack,
                error=relative(exc.message, scratch.root),
                outcome="refused" if isinstance(exc, MaintenanceError) else "failed")
        resolved = declared(scratch, target)
        after = resolved.stack
        companions = {**result.companions, **more}
        patches = [v for p in after.projects if p.key in companions
                   for v in _verdicts(p.key, companions[p.key])]
        patches += _verdicts(project.key, result.classifications)
        stale = unbacked_claims(resolved)
    steps = [Step(run=command("bump", *args), why="moves the pin" if not new_stack else
                  "a stack of its own: " + "; ".join(relative(r, ws.root) for r in refusing))]
    steps += [Step(run=command("bump", target, key, "--continue"),
                   why=f"once {patch} ({key}) is {todo}; "
                       f"`{command('bump', target, key, '--skip')}` drops it instead")
              for key, patch, todo in stops]
    steps.append(Step(run=command("build", "--stack", target), why="the stack's wheels"))
    for remake in dict.fromkeys(c.command for c in stale if c.command):
        named = [c for c in stale if c.command == remake]
        steps.append(Step(run=remake, why=f"re-makes the record {len(named)} claim(s) name"
                          + (f" (needs {named[0].needs})" if named[0].needs else "")))
    return ReleaseWatch(
        version=str(version), outcome="stops" if stops else "bumps", new_stack=new_stack,
        patches=tuple(patches), moves=tuple(_moves(stack, after, project.key)),
        claims=tuple((c.name, f"{c.state}: {'; '.join(c.reasons)}") for c in stale),
        steps=tuple(steps))


def watch_project(ws: Workspace, stack: Stack, project: Project, *, limit: int,
                  cache: Path) -> ProjectWatch:
    """The project's releases newer than its pin, the newest ``limit`` bumped in scratch."""
    base = ProjectWatch(project=project.key, distribution=project.distribution,
                        pinned=project.version)
    pinned = Version(project.version)  # pre-releases only when the pin is one
    try:
        newer = sorted((v for v in project_page(project).releases(project)
                        if v > pinned and (pinned.is_prerelease or not v.is_prerelease)),
                       reverse=True)
    except ToolkitError as exc:
        return dataclasses.replace(base, error=exc.message)
    log.info("watch: %s/%s %s: %d newer release(s) on the package index%s", stack.name,
             project.key, project.version, len(newer),
             f"; bumping the newest {min(limit, len(newer))} in scratch" if newer else "")
    releases = []
    for i, version in enumerate(newer[:limit], 1):
        log.info("watch: [%d/%d] %s/%s %s -> %s", i, min(limit, len(newer)), stack.name,
                 project.key, project.version, version)
        release = watch_release(ws, stack, project, version, cache)
        log.info("watch: %s/%s %s: %s", stack.name, project.key, version, summary(release))
        releases.append(release)
    return dataclasses.replace(base, newer=tuple(map(str, newer)), releases=tuple(releases))


def watch(ws: Workspace, stacks: Sequence[str] = (), *, limit: int) -> list[StackWatch]:
    found = ws.stacks()
    names = sorted(stacks or found)
    missing = [n for n in names if n not in found]
    if missing:
        raise ConfigError(f"no stack {', '.join(missing)}", where="forks/",
                          fix=f"stacks: {', '.join(sorted(found))}")
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("watch-cache")) as tmp:
        cache = Path(tmp)  # the downloads every scratch bump shares, the checkout's linked
        for real, kind in ((ws.sdist_cache, "sdists"), (ws.wheel_cache, "wheels")):
            (cache / kind).mkdir(parents=True, exist_ok=True)
            for f in sorted(real.glob("*")):
                if f.is_file():
                    (cache / kind / f.name).symlink_to(f.resolve())
        return [StackWatch(stack=name, date=today(), limit=limit, projects=tuple(
                    watch_project(ws, found[name], p, limit=limit, cache=cache)
                    for p in found[name].projects)) for name in names]


def summary(release: ReleaseWatch) -> str:
    if release.outcome in ("refused", "failed", "carried"):
        return f"{release.outcome}: {release.error}"
    text = verdict_counts(p.verdict for p in release.patches)
    extra = [*(f"moves {m}" for m in release.moves),
             f"{len(release.claims)} claim(s) to re-make" if release.claims else ""]
    return "; ".join([f"{release.outcome}: {text}", *filter(None, extra)])


def write_report(ws: Workspace, sw: StackWatch) -> tuple[Path, Path]:
    json_path = ws.reports_dir / "watch" / f"{sw.stack}.json"
    md_path = json_path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(dataclasses.asdict(sw), indent=1) + "\n")
    atomic_write_text(md_path, "\n".join(markdown(sw)) + "\n")
    return json_path, md_path


def markdown(sw: StackWatch) -> list[str]:
    lines = [f"# Watch: stack {sw.stack} ({sw.date})", "",
             "Each release on the package index newer than a pin, the newest "
             f"{sw.limit} of each project bumped in a scratch copy of the checkout "
             f"(`{command('watch', '--stack', sw.stack, '--limit', str(sw.limit))}`).", ""]
    for pw in sw.projects:
        lines += [f"## {pw.project}: {pw.distribution} {pw.pinned}", ""]
        if pw.error:
            lines += [f"The package index could not be read: {pw.error}", ""]
            continue
        untried = pw.newer[len(pw.releases):]
        lines += [f"Newer: {', '.join(pw.newer) or 'none'}"
                  + (f" (not bumped here: {', '.join(untried)})" if untried else ""), ""]
        for r in pw.releases:
            lines += [f"### {r.version}: {summary(r)}", ""]
            if r.patches:
                lines += ["| project | patch | verdict |", "|---|---|---|",
                          *(f"| {p.project} | {p.patch} | {p.verdict} |" for p in r.patches),
                          ""]
            if r.claims:
                lines += ["Claims to re-make:", "",
                          *(f"- {name} ({why})" for name, why in r.claims), ""]
            if r.steps:
                lines += ["Then:", "",
                          *(f"{i}. `{s.run}`: {s.why}" for i, s in enumerate(r.steps, 1)), ""]
    return lines
