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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from sm120fork import __version__
from sm120fork.declare import Project, Stack, pinned_for, requirement_applies
from sm120fork.errors import BuildError
from sm120fork.fetch.sdist import download_sdist
from sm120fork.fetch.source import Progress, source_key
from sm120fork.fetch.wheel import download_wheels
from sm120fork.package.artifact import check_wheel, require_passed
from sm120fork.package.publish import ProjectBuild, publish
from sm120fork.package.repack import check_same_preimage, check_series_for_wheel, repack_wheel
from sm120fork.package.wheel import build_wheel, wheel_extras, wheel_requirements
from sm120fork.patch.series import Series, load_series
from sm120fork.patch.tree import keep_local_work_hint, local_work, prepare_tree
from sm120fork.plugin.build import build_plugin, plugin_files
from sm120fork.util.files import (
    atomic_copy,
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
        "project": asdict(project),
        "source": source_key(project, kind),
        "series": series.digest,
    }, sort_keys=True, default=str)  # Requirement objects as their PEP 508 text
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _load_entry(entry_dir: Path) -> dict[str, Any] | None:
    entry = read_json_object(entry_dir / ENTRY)
    if entry is None:
        return None
    wheel = entry_dir / str(entry.get("wheel", ""))
    if not wheel.is_file() or sha256_file(wheel) != entry.get("sha256"):
        return None
    return entry


def _cached(ws: Workspace, stack: Stack, project: Project) -> bool:
    series = load_series(ws.series_dir(project))
    key = cache_key(project, series, project.source)
    return _load_entry(ws.build_cache(stack, project) / key) is not None


#: Called as ``stage(project_key, what)`` as a project moves on ("patching", each line
#: of the wheel build, "checking the wheel"): the CLI's live progress line.
Stage = Callable[[str, str], None]


def _commit_entry(staging: Path, entry_dir: Path, entry: dict[str, Any]) -> None:
    """Write the cache entry's record into ``staging``, then swap it in as ``entry_dir``."""
    atomic_write_text(staging / ENTRY, json.dumps(entry, indent=2) + "\n")
    if entry_dir.exists():
        shutil.rmtree(entry_dir)
    entry_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, entry_dir)


def _no_stage(project: str, what: str) -> None:
    return None


def build_project(ws: Workspace, stack: Stack, project: Project, *, force: bool = False,
                  rebuild: bool = False, progress: Progress | None = None,
                  stage: Stage = _no_stage) -> ProjectBuild:
    start = time.monotonic()
    series = load_series(ws.series_dir(project))
    kind = project.source
    key = cache_key(project, series, kind)
    entry_dir = ws.build_cache(stack, project) / key
    entry = None if rebuild else _load_entry(entry_dir)
    if entry is not None:
        log.info("%s: inputs unchanged, reusing %s", project.key, entry["wheel"])
        why = local_work(ws, stack, project)
        if why:  # the cache is keyed on the series: say that the tree's work is not in it
            work = ws.work_tree(stack, project)
            log.warning("%s: the fork tree %s has local work (%s); the cached wheel holds "
                        "the series without it. To build it: %s", project.key, work, why,
                        keep_local_work_hint(work, why, stack, project))
        return ProjectBuild(project=project.key, distribution=project.distribution,
                            upstream_version=project.version, version=project.local_version,
                            wheel=entry_dir / entry["wheel"], sha256=entry["sha256"],
                            cached=True, seconds=time.monotonic() - start, entry=entry)
    stage(project.key, "fetching and patching")
    tree = prepare_tree(ws, stack, project, patches=series.patches, force=force,
                        progress=progress)
    staging = Path(tempfile.mkdtemp(prefix=scratch_prefix(key), dir=ws.state_dir))
    try:
        stage(project.key, "building the wheel")
        wheel = build_wheel(project, tree.repo, staging,
                            on_line=lambda line: stage(project.key, f"building: {line}"))
        stage(project.key, "checking the wheel")
        results = check_wheel(wheel, project, series, tree.repo)
        require_passed(results, project)
        digest = sha256_file(wheel)
        entry = {
            "project": project.key,
            "distribution": project.distribution,
            "upstream_version": project.version,
            "version": project.local_version,
            "upstream_commit": project.git_pin.commit,
            "upstream_commit_verified": project.git_pin.commit_verified,
            "source": {"kind": kind, "digest": tree.state.source.split(":", 1)[1],
                       "filename": project.sdist_pin.filename if kind == "sdist" else None,
                       "url": project.git_pin.url if kind == "git" else None},
            "series": project.series,
            "series_digest": series.digest,
            "patches": [{"name": p.name, "sha256": p.sha256, "subject": p.subject,
                         "applied_upstream": p.applied_upstream}
                        for p in series.patches],
            "patched_commit": tree.state.head,
            "tree": tree.repo.tree_hash(),
            "wheel": wheel.name,
            "sha256": digest,
            "artifact_check": [r.to_json() for r in results],
            "toolkit_version": __version__,
        }
        _commit_entry(staging, entry_dir, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ProjectBuild(project=project.key, distribution=project.distribution,
                        upstream_version=project.version, version=project.local_version,
                        wheel=entry_dir / wheel.name, sha256=digest, cached=False,
                        seconds=time.monotonic() - start, entry=entry)


def _load_entries(entry_dir: Path) -> list[dict[str, Any]] | None:
    """The cached entries of a project that ships several wheels (``wheels`` in entry.json)."""
    data = read_json_object(entry_dir / ENTRY)
    entries = data.get("wheels") if data is not None else None
    if not isinstance(entries, list) or not entries:
        return None
    for entry in entries:
        wheel = entry_dir / str(entry.get("wheel", ""))
        if not wheel.is_file() or sha256_file(wheel) != entry.get("sha256"):
            return None
    return entries


def ships_wheels(project: Project, series: Series) -> bool:
    """Built from published wheels: a ``wheel`` source, or an empty series (as published)."""
    return project.source == "wheel" or (not series.patches and bool(project.wheels))


def _common_entry(project: Project, series: Series) -> dict[str, Any]:
    git = project.git
    return {
        "project": project.key,
        "distribution": project.distribution,
        "upstream_version": project.version,
        "upstream_commit": git.commit if git else None,
        "upstream_commit_verified": git.commit_verified if git else False,
        "series": project.series,
        "series_digest": series.digest,
        "patches": [{"name": p.name, "sha256": p.sha256, "subject": p.subject,
                     "applied_upstream": p.applied_upstream} for p in series.patches],
    }


def build_from_wheels(ws: Workspace, stack: Stack, project: Project, *, force: bool = False,
                      rebuild: bool = False,
                      progress: Progress | None = None) -> list[ProjectBuild]:
    """Each declared wheel: as published (empty series), or patched and repacked."""
    start = time.monotonic()
    series = load_series(ws.series_dir(project))
    key = cache_key(project, series, "wheel")
    entry_dir = ws.build_cache(stack, project) / key
    entries = None if rebuild else _load_entries(entry_dir)
    cached = entries is not None
    if entries is None:
        entries = _make_wheel_entries(ws, stack, project, series, key, force=force,
                                      progress=progress)
    else:
        log.info("%s: inputs unchanged, reusing %d wheel(s)", project.key, len(entries))
    seconds = time.monotonic() - start
    return [ProjectBuild(project=project.key, distribution=project.distribution,
                         upstream_version=project.version, version=str(e["version"]),
                         wheel=entry_dir / e["wheel"], sha256=e["sha256"], cached=cached,
                         seconds=seconds, entry=e) for e in entries]


def _make_wheel_entries(ws: Workspace, stack: Stack, project: Project, series: Series,
                        key: str, *, force: bool,
                        progress: Progress | None) -> list[dict[str, Any]]:
    entry_dir = ws.build_cache(stack, project) / key
    originals = download_wheels(project, ws.wheel_cache, progress)
    common = _common_entry(project, series)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=ws.state_dir))
    entries: list[dict[str, Any]] = []
    try:
        if not series.patches:
            for pin, original in zip(project.wheels, originals, strict=True):
                atomic_copy(original, staging / original.name)
                entries.append({
                    **common, "version": project.version, "used_as_published": True,
                    "source": {"kind": "wheel", "digest": pin.sha256,
                               "filename": pin.filename, "url": pin.url or None},
                    "wheel": original.name, "sha256": pin.sha256, "artifact_check": [],
                    "toolkit_version": __version__,
                })
                log.info("%s: %s used as published (sha256 %s)", project.key, pin.filename,
                         pin.sha256[:12])
        else:
            changed = check_series_for_wheel(project, series, originals[0], stack=stack.name)
            for other in originals[1:]:
                check_same_preimage(originals[0], other, list(changed.values()))
            tree = prepare_tree(ws, stack, project, patches=series.patches, force=force,
                                progress=progress)
            replacements = {member: (tree.path / path).read_bytes()
                            for path, member in changed.items()}
            epoch = tree.repo("log", "-1", "--format=%ct", quiet=True)
            for pin, original in zip(project.wheels, originals, strict=True):
                wheel = repack_wheel(project, original, replacements, staging,
                                     source_date_epoch=epoch)
                results = check_wheel(wheel, project, series, tree.repo)
                require_passed(results, project)
                entries.append({
                    **common, "version": project.local_version, "used_as_published": False,
                    "source": {"kind": "wheel", "digest": pin.sha256,
                               "filename": pin.filename, "url": pin.url or None},
                    "patched_commit": tree.state.head, "tree": tree.repo.tree_hash(),
                    "changed_files": sorted(changed.values()),
                    "wheel": wheel.name, "sha256": sha256_file(wheel),
                    "artifact_check": [r.to_json() for r in results],
                    "toolkit_version": __version__,
                })
        _commit_entry(staging, entry_dir, {"wheels": entries})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entries


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


def _as_list(fn: Callable[..., ProjectBuild], *args: Any, **kwargs: Any) -> list[ProjectBuild]:
    return [fn(*args, **kwargs)]


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
                jobs: int = os.cpu_count() or 1, stage: Stage = _no_stage) -> list[ProjectBuild]:
    """Build every project of ``stack`` (or ``only`` those); publish to wheels/<stack>/ (or out)."""
    projects = [stack.project(k) for k in only] if only else list(stack.projects)
    allow_children()
    with ws.lock(lock_timeout):
        remove_leftovers(ws, stack)
        # Downloads one at a time (one progress bar), then the projects' patch + build +
        # check concurrently: they share nothing, and a wheel build leaves cores idle.
        from_wheels = {p.key for p in projects
                       if ships_wheels(p, load_series(ws.series_dir(p)))}
        for p in projects:
            bar = progress(p.key) if progress else None
            if p.key in from_wheels:
                download_wheels(p, ws.wheel_cache, bar)
            elif p.source == "sdist" and (rebuild or not _cached(ws, stack, p)):
                download_sdist(p, ws.sdist_cache, bar)
        with ThreadPoolExecutor(max_workers=max(1, min(len(projects), jobs))) as pool:
            futures = [pool.submit(build_from_wheels, ws, stack, p, force=force,
                                   rebuild=rebuild) if p.key in from_wheels
                       else pool.submit(_as_list, build_project, ws, stack, p, force=force,
                                        rebuild=rebuild, stage=stage)
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
            plugin = build_plugin(ws, stack, force=force)
            log.info("%s", plugin.message)
            publish(ws, stack, builds, out, extra=plugin_files(plugin))
    return builds
