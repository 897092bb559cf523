"""``build``: pinned upstream -> patched tree -> wheel -> artifact check -> wheels/<stack>/.

Work is cached per project under ``.forks/builds/<stack>/<project>/<key>``, the key
hashing the pin, the source digest and the series digest: a second build with nothing
changed touches no git tree, and changing one project's series rebuilds only that one.
``wheels/<stack>/`` is replaced as a whole (:mod:`sm120fork.package.publish`) only after
every project built and passed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from sm120fork.declare import Project, Stack, pinned_for, requirement_applies
from sm120fork.errors import BuildError, DirtyTreeError
from sm120fork.fetch.kinds import source_key
from sm120fork.fetch.source import Progress
from sm120fork.manifest import ManifestEntry
from sm120fork.package.kinds import Job, Stage, kind_for, no_stage
from sm120fork.package.publish import ProjectBuild, check_writable, publish
from sm120fork.package.wheel import wheel_extras, wheel_requirements
from sm120fork.patch.series import Series, load_series
from sm120fork.patch.tree import (
    keep_local_work_hint,
    local_work,
    other_series,
    other_series_fix,
)
from sm120fork.plugin.build import build_plugin, plugin_files, sglang_project
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


def cache_key(project: Project, series: Series, kind: str) -> str:
    payload = json.dumps({
        "recipe": BUILD_RECIPE,
        "project": project.build_inputs(),
        "source": source_key(project, kind),
        "series": series.digest,
    }, sort_keys=True, default=str)  # Requirement objects as their PEP 508 text
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _load_entries(entry_dir: Path) -> list[ManifestEntry] | None:
    """The cached entries (``{"wheels": [...]}``, or one entry as older toolkits wrote),
    or None unless every wheel they name is there with its sha256."""
    data = read_json_object(entry_dir / ENTRY)
    if data is None:
        return None
    records = data.get("wheels", [data])
    try:
        entries = [ManifestEntry.from_json(r) for r in records]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    for entry in entries:
        wheel = entry_dir / entry.wheel
        if not wheel.is_file() or sha256_file(wheel) != entry.sha256:
            return None
    return entries or None


def _entry_dir(ws: Workspace, stack: Stack, project: Project, series: Series) -> Path:
    kind = kind_for(project, series)
    return ws.build_cache(stack, project) / cache_key(project, series, kind.cache_kind)


def _commit_entry(staging: Path, entry_dir: Path, entries: list[ManifestEntry]) -> None:
    """Write the cache entry's record into ``staging``, then swap it in as ``entry_dir``."""
    record = {"wheels": [e.to_json() for e in entries]}
    atomic_write_text(staging / ENTRY, json.dumps(record, indent=2) + "\n")
    if entry_dir.exists():
        shutil.rmtree(entry_dir)
    entry_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, entry_dir)


def build_project(ws: Workspace, stack: Stack, project: Project, *,
                  series: Series | None = None, force: bool = False, rebuild: bool = False,
                  progress: Progress | None = None, inputs: list[Path] | None = None,
                  stage: Stage = no_stage) -> list[ProjectBuild]:
    """The project's checked wheels, whatever its source kind (:mod:`.kinds`): from the
    build cache when the pin, source and series are unchanged, else built now.

    ``inputs``: the kind's downloads, when the caller made them already.
    """
    start = time.monotonic()
    series = series if series is not None else load_series(ws.series_dir(project))
    kind = kind_for(project, series)
    key = cache_key(project, series, kind.cache_kind)
    entry_dir = ws.build_cache(stack, project) / key
    entries = None if rebuild else _load_entries(entry_dir)
    cached = entries is not None
    if entries is not None and kind.has_tree and (
            stale := other_series(ws, stack, project, series)):
        # The cached wheel is of the series, the fork tree is not: a refresh from it
        # would write the other series back into patches/.
        raise DirtyTreeError(f"the fork tree of {project.key} cannot be reused: {stale}",
                             where=str(ws.work_tree(stack, project)),
                             fix=other_series_fix(ws, stack, project))
    if entries is not None:
        log.info("%s: inputs unchanged, reusing %s", project.key,
                 ", ".join(e.wheel for e in entries))
        why = local_work(ws, stack, project) if kind.has_tree else None
        if why:  # the cache is keyed on the series: say that the tree's work is not in it
            work = ws.work_tree(stack, project)
            log.warning("%s: the fork tree %s has local work (%s); the cached wheel holds "
                        "the series without it. To build it: %s", project.key, work, why,
                        keep_local_work_hint(work, why, stack, project))
    else:
        job = Job(ws=ws, stack=stack, project=project, series=series, force=force,
                  progress=progress, stage=stage)
        if inputs is None:
            inputs = kind.download(job)
        staging = Path(tempfile.mkdtemp(prefix=scratch_prefix(key), dir=ws.state_dir))
        try:
            entries = kind.make(job, inputs, staging)
            _commit_entry(staging, entry_dir, entries)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - start
    return [ProjectBuild(project=project.key, distribution=project.distribution,
                         upstream_version=project.version, version=e.version,
                         wheel=entry_dir / e.wheel, sha256=e.sha256, cached=cached,
                         seconds=seconds, entry=e) for e in entries]


def check_requirements(stack: Stack, builds: list[ProjectBuild]) -> None:
    """Each wheel's requirements on the stack's projects: declared, and met by our builds.

    The declaration's ``upstream_requires`` must be exactly what the wheel's METADATA
    requires of the stack's projects (and their companions), and every such requirement
    must accept the version we ship, extras included.
    """
    ours: dict[str, ProjectBuild] = {}
    for b in builds:
        ours.setdefault(canonicalize_name(b.distribution), b)
    for b in builds:
        project = stack.project(b.project)
        on_stack = [r for r in wheel_requirements(b.wheel)
                    if (t := pinned_for(r, stack.projects)) is not None and t is not project]
        declared = list(project.upstream_requires)
        where = f"stack {stack.name}, {b.wheel.name}"
        for req in on_stack:
            if req not in declared:
                raise BuildError(
                    f"the wheel requires {req}, which projects.{project.key}.upstream_requires "
                    f"does not state ({', '.join(map(str, declared)) or 'empty'})",
                    where=where, fix=f"add {str(req)!r} to {stack.path}")
        for req in declared:
            if req not in on_stack:
                raise BuildError(
                    f"projects.{project.key}.upstream_requires states {req}, which the "
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
            missing = {canonicalize_name(e) for e in req.extras} - wheel_extras(target.wheel)
            if missing:
                raise BuildError(
                    f"{b.wheel.name} requires {req}, but the stack's pin "
                    f"{target.distribution} {target.version} ({target.wheel.name}) provides "
                    f"no extra {', '.join(sorted(missing))}", where=f"stack {stack.name}",
                    fix=f"pin the {target.distribution} release {project.distribution} "
                        f"{project.version} requires")


def remove_leftovers(ws: Workspace, stack: Stack) -> None:
    """Scratch files and folders of runs that were killed (SIGKILL) before cleaning up."""
    for parent in (ws.state_dir, ws.trees_dir / stack.name, ws.sdist_cache,
                   Path(tempfile.gettempdir())):
        for path in remove_stale_scratch(parent):
            log.info("removed %s, left by a killed run", path)


def build_stack(ws: Workspace, stack: Stack, *, force: bool = False, rebuild: bool = False,
                only: list[str] | None = None,
                progress: Callable[[str], Progress | None] | None = None,
                lock_timeout: float = -1, out: Path | None = None,
                jobs: int = os.cpu_count() or 1, stage: Stage = no_stage) -> list[ProjectBuild]:
    """Build every project of ``stack`` (or ``only`` those); publish to wheels/<stack>/ (or out)."""
    projects = [stack.project(k) for k in only] if only else list(stack.projects)
    if not only:
        check_writable(out or ws.stack_wheels(stack.name), stack)
    allow_children()
    with ws.lock(lock_timeout):
        remove_leftovers(ws, stack)
        # The series once per build; downloads one at a time (one progress bar), then the
        # projects' patch + build + check concurrently: they share nothing, and a wheel
        # build leaves cores idle.
        series = {p.key: load_series(ws.series_dir(p)) for p in projects}
        inputs: dict[str, list[Path] | None] = {}
        for p in projects:
            cached = not rebuild and _load_entries(_entry_dir(ws, stack, p, series[p.key]))
            if cached:
                inputs[p.key] = None
                continue
            job = Job(ws=ws, stack=stack, project=p, series=series[p.key],
                      progress=progress(p.key) if progress else None)
            inputs[p.key] = kind_for(p, series[p.key]).download(job)
        with ThreadPoolExecutor(max_workers=max(1, min(len(projects), jobs))) as pool:
            futures = [pool.submit(build_project, ws, stack, p, series=series[p.key],
                                   force=force, rebuild=rebuild, inputs=inputs[p.key],
                                   stage=stage)
                       for p in projects]
            try:
                builds = [b for f in futures for b in f.result()]
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through the CLI's handler
                # End the projects' builds now, so the pool's shutdown does not wait for
                # them; each worker removes its own scratch folders as its build fails.
                end_children()
                raise
        check_requirements(stack, builds)
        if not only:
            sglang = sglang_project(stack)
            plugin = build_plugin(ws, stack, force=force,
                                  series=series.get(sglang.key) if sglang else None)
            log.info("%s", plugin.message)
            publish(ws, stack, builds, out, extra=plugin_files(plugin))
    return builds
