"""``build``: pinned upstream -> patched tree -> wheel -> artifact check -> wheels/<stack>/.

Work is cached per project under ``.forks/builds/<stack>/<project>/<key>`` (the pin, the
source and the series hashed): a build with nothing changed touches no git tree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from sm120fork.declare import Stack, pinned_for, requirement_applies
from sm120fork.errors import BuildError, ConfigError, DirtyTreeError
from sm120fork.fetch.kinds import source_key
from sm120fork.manifest import UNCHECKED, ManifestEntry
from sm120fork.package.kinds import Job, Options, kind_for
from sm120fork.package.publish import ProjectBuild, check_writable, publish
from sm120fork.package.wheel import wheel_extras, wheel_requirements
from sm120fork.patch.tree import (
    keep_local_work_hint,
    local_work,
    other_series,
    other_series_fix,
)
from sm120fork.plugin.build import build_plugin
from sm120fork.resolved import ResolvedStack
from sm120fork.util import typed
from sm120fork.util.files import (
    atomic_write_text,
    read_json_object,
    remove_stale_scratch,
    scratch_prefix,
    sha256_file,
)
from sm120fork.util.proc import allow_children, end_children
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")
ENTRY = "entry.json"
#: Bump when the way wheels are produced changes, to invalidate build caches.
BUILD_RECIPE = 1


def _cached(job: Job) -> list[ManifestEntry] | None:
    """The cached entries (``{"wheels": [...]}``), or None unless every wheel they name is
    there with its sha256 (an entry of another form is rebuilt and replaced).  A build made
    unchecked (``--unchecked``) is reused only by another such build."""
    data = None if job.options.rebuild else read_json_object(job.entry_dir / ENTRY)
    records = data.get("wheels") if data is not None else None
    if not isinstance(records, list):
        return None
    try:
        entries = [typed.read(ManifestEntry, r, job.entry_dir / ENTRY, strict=False)
                   for r in records]
    except ConfigError:
        return None
    if not job.options.unchecked and job.kind.has_tree and any(
            not e.check or e.check.startswith(UNCHECKED) for e in entries):
        return None  # built unchecked (or before the check existed): check it now
    wheels = [(job.entry_dir / e.wheel, e.sha256) for e in entries]
    whole = all(w.is_file() and sha256_file(w) == sha256 for w, sha256 in wheels)
    return entries if entries and whole else None


def build_project(job: Job, inputs: list[Path] | None) -> list[ProjectBuild]:
    """The project's checked wheels, whatever its source kind (:mod:`.kinds`): from the
    build cache when the pin, source and series are unchanged, else built now from
    ``inputs``, the kind's downloads (None: download them now)."""
    start = time.monotonic()
    ws, stack, project, kind, entry_dir = job.ws, job.stack, job.project, job.kind, job.entry_dir
    entries = _cached(job)
    cached = entries is not None
    if entries is not None:
        if kind.has_tree and (stale := other_series(ws, stack, project, job.series)):
            # The cached wheel is of the series, the fork tree is not: a refresh from it
            # would write the other series back into patches/.
            raise DirtyTreeError(f"the fork tree of {project.key} cannot be reused: {stale}",
                                 where=str(ws.work_tree(stack, project)),
                                 fix=other_series_fix(ws, stack, project))
        log.info("%s: inputs unchanged, reusing %s", project.key,
                 ", ".join(e.wheel for e in entries))
        # the cache is keyed on the series: say that the tree's work is not in it
        if kind.has_tree and (why := local_work(ws, stack, project)):
            work = ws.work_tree(stack, project)
            log.warning("%s: the fork tree %s has local work (%s); the cached wheel holds "
                        "the series without it. To build it: %s", project.key, work, why,
                        keep_local_work_hint(work, why, stack, project))
    else:
        if inputs is None:
            inputs = kind.source.download(project, ws)
        staging = Path(tempfile.mkdtemp(prefix=scratch_prefix(entry_dir.name),
                                        dir=ws.state_dir))
        try:
            entries = kind.make(job, inputs, staging)
            record = {"wheels": [typed.dump(e, nulls=True) for e in entries]}
            atomic_write_text(staging / ENTRY, json.dumps(record, indent=2) + "\n")
            if entry_dir.exists():  # swapped in whole, the record inside
                shutil.rmtree(entry_dir)
            entry_dir.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, entry_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - start
    return [ProjectBuild(project=project.key, distribution=project.distribution,
                         upstream_version=project.version, version=e.version,
                         wheel=entry_dir / e.wheel, sha256=e.sha256, cached=cached,
                         seconds=seconds, entry=e) for e in entries]


def remove_leftovers(ws: Workspace, stack: Stack) -> None:
    """Scratch files and folders of runs that were killed (SIGKILL) before cleaning up."""
    for parent in (ws.state_dir, ws.trees_dir / stack.name, ws.sdist_cache,
                   Path(tempfile.gettempdir())):
        for path in remove_stale_scratch(parent):
            log.info("removed %s, left by a killed run", path)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a build builds, resolved once and passed down every stage: the stack, the
    projects (all of them, or ``only`` those), each with its series and kind."""

    resolved: ResolvedStack
    projects: tuple[Job, ...]
    #: Every project of the stack: the build publishes (a partial build only builds).
    whole: bool
    options: Options


@dataclass(frozen=True, kw_only=True)
class Fetched:
    """The fetch stage's result: each project's downloads (None: its cached build serves)."""

    plan: Plan
    inputs: Mapping[str, list[Path] | None]


@dataclass(frozen=True, kw_only=True)
class Built:
    """The build stage's result (and the check's and publish's, which add no data): every
    wheel of the plan, checked against its series."""

    plan: Plan
    builds: tuple[ProjectBuild, ...]


def load(resolved: ResolvedStack, options: Options, only: Sequence[str] | None = None) -> Plan:
    """Stage 1: the plan, of the series the stack was resolved with."""
    ws, stack = resolved.ws, resolved.stack
    jobs = []
    for p in [stack.project(k) for k in only] if only else stack.projects:
        series = resolved.series[p.key]
        kind = kind_for(p, series)
        key = json.dumps({"recipe": BUILD_RECIPE, "project": p.build_inputs(),
                          "source": source_key(p, kind.source.name), "series": series.digest},
                         sort_keys=True, default=str)  # Requirement objects as PEP 508 text
        jobs.append(Job(ws=ws, stack=stack, project=p, series=series, kind=kind,
                        entry_dir=ws.build_cache(stack, p)
                        / hashlib.sha256(key.encode()).hexdigest()[:24], options=options))
    return Plan(resolved=resolved, projects=tuple(jobs), whole=not only, options=options)


def fetch(plan: Plan) -> Fetched:
    """Stage 2: the downloads, one at a time (one progress bar each), before the projects
    build side by side; none for a project whose cached build serves."""
    progress = plan.options.progress
    inputs: dict[str, list[Path] | None] = {}
    for job in plan.projects:
        key = job.project.key
        inputs[key] = None if _cached(job) else job.kind.source.download(
            job.project, job.ws, progress(key) if progress else None)
    return Fetched(plan=plan, inputs=inputs)


def build(fetched: Fetched) -> Built:
    """Stages 3-5 per project, concurrently (they share nothing, and a wheel build leaves
    cores idle): patch the fork tree, build, check the wheel (the kind's ``make``)."""
    plan = fetched.plan
    with ThreadPoolExecutor(max_workers=max(1, min(len(plan.projects), plan.options.jobs))
                            ) as pool:
        futures = [pool.submit(build_project, job, fetched.inputs[job.project.key])
                   for job in plan.projects]
        try:
            builds = tuple(b for f in futures for b in f.result())
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through the CLI's handler
            # End the projects' builds now, so the pool's shutdown does not wait for
            # them; each worker removes its own scratch folders as its build fails.
            end_children()
            raise
    return Built(plan=plan, builds=builds)


def check(built: Built) -> Built:
    """Stage 6: each wheel's requirements on the stack's projects are exactly its declared
    ``upstream_requires`` and accept the version we ship, extras included."""
    stack = built.plan.resolved.stack
    # the first wheel of each distribution (a project may ship one per platform)
    ours = {canonicalize_name(b.distribution): b for b in reversed(built.builds)}
    for b in built.builds:
        project = stack.project(b.project)
        on_stack = [r for r in wheel_requirements(b.wheel)
                    if (t := pinned_for(r, stack.projects)) is not None and t is not project]
        declared = list(project.upstream_requires)
        where = f"stack {stack.name}, {b.wheel.name}"
        if unstated := [r for r in on_stack if r not in declared]:
            raise BuildError(
                f"the wheel requires {unstated[0]}, which projects.{project.key}."
                f"upstream_requires does not state ({', '.join(map(str, declared)) or 'empty'})",
                where=where, fix=f"add {str(unstated[0])!r} to {stack.path}")
        if unmet := [r for r in declared if r not in on_stack]:
            raise BuildError(
                f"projects.{project.key}.upstream_requires states {unmet[0]}, which the "
                "wheel's METADATA does not require", where=where,
                fix=f"copy the wheel's own requirement into {stack.path}")
        for req in on_stack:
            target = ours.get(canonicalize_name(req.name))
            if target is None or not requirement_applies(req, project):
                continue
            if not req.specifier.contains(Version(target.version), prereleases=True):
                raise BuildError(
                    f"{b.wheel.name} requires {req}, which rejects our {target.version}",
                    where=f"stack {stack.name}",
                    fix="align the local label or the dependency pin")
            if missing := {canonicalize_name(e) for e in req.extras} - wheel_extras(target.wheel):
                raise BuildError(
                    f"{b.wheel.name} requires {req}, but the stack's pin "
                    f"{target.distribution} {target.version} ({target.wheel.name}) provides "
                    f"no extra {', '.join(sorted(missing))}", where=f"stack {stack.name}",
                    fix=f"pin the {target.distribution} release {project.distribution} "
                        f"{project.version} requires")
    return built


def stage_and_publish(built: Built) -> Built:
    """Stage 7: the plugin built from the SGLang series, then everything the stack's
    folder holds staged and swapped in once (a partial build publishes nothing)."""
    plan = built.plan
    if not plan.whole:
        return built
    plugin = build_plugin(plan.resolved.ws, plan.resolved.stack, plan.resolved.series,
                          force=plan.options.force)
    log.info("%s", plugin.message)
    publish(plan.resolved.ws, plan.resolved.stack, list(built.builds), plan.options.out,
            extra=plugin.files())
    return built


def build_stack(ws: Workspace, stack: Stack, options: Options | None = None, *,
                only: list[str] | None = None, lock_timeout: float = -1) -> list[ProjectBuild]:
    """Build every project of ``stack`` (or ``only`` those); publish to wheels/<stack>/ (or
    ``options.out``).  Each stage takes the previous one's typed result."""
    options = options or Options()
    if not only:
        check_writable(options.out or ws.stack_wheels(stack.name), stack)
    allow_children()
    with ws.lock(lock_timeout):
        remove_leftovers(ws, stack)
        plan = load(ResolvedStack.of(ws, stack), options, only)
        built = stage_and_publish(check(build(fetch(plan))))
    return list(built.builds)
