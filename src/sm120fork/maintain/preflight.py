"""A bump's pre-flight, before a file is written: the other pins, the new release's own
pins (``Requires-Dist``), each patch's target files and the layout that fits."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from sm120fork.declare import Project, Stack, coordinated_pin_problems, pinned_for
from sm120fork.errors import MaintenanceError, SourceError
from sm120fork.fetch.archive import is_metadata, source_members
from sm120fork.layouts import LAYOUTS, fitting, marker
from sm120fork.package.wheel import wheel_requirements
from sm120fork.patch.series import Patch
from sm120fork.util.hint import command

_COMMIT_IN_SOURCE = re.compile(
    r"""(?:__git_commit__|git_commit|__git_version__|git_version|__commit__)\s*[:=]\s*"""
    r"""["']([0-9a-f]{40})["']""")
_VERSION_FILES = ("_build_meta.py", "_version.py", "version.py", "git_version.py")


@dataclass(frozen=True, kw_only=True)
class Release:
    """A release's files (relative to the package root) and requirements."""

    files: frozenset[str]
    requires: tuple[Requirement, ...]
    #: The git commit an sdist records about itself (FlashInfer's _build_meta.py), or "".
    commit: str = ""


def wheel_release(wheel: Path) -> Release:
    return Release(files=frozenset(source_members(wheel)),
                   requires=tuple(wheel_requirements(wheel)))


def sdist_release(sdist: Path) -> Release:
    files: set[str] = set()
    requires: list[Requirement] = []
    commit = ""
    try:
        with tarfile.open(sdist, "r:*") as tf:
            for member in tf:
                parts = PurePosixPath(member.name).parts
                if len(parts) < 2 or not member.isfile():
                    continue
                rel = "/".join(parts[1:])
                files.add(rel)
                if rel != "PKG-INFO" and (commit or len(parts) > 4
                                          or parts[-1] not in _VERSION_FILES):
                    continue
                text = (tf.extractfile(member) or io.BytesIO()).read().decode(errors="replace")
                if rel != "PKG-INFO":
                    found = _COMMIT_IN_SOURCE.search(text)
                    commit = found.group(1) if found else ""
                    continue
                for line in Parser().parsestr(text).get_all("Requires-Dist") or []:
                    with contextlib.suppress(InvalidRequirement):
                        requires.append(Requirement(line))
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"cannot list the sdist: {exc}", where=str(sdist)) from exc
    return Release(files=frozenset(f for f in files if not is_metadata(f)),
                   requires=tuple(requires), commit=commit)


def pins_refusing(stack: Stack, project: Project, new_version: str) -> list[str]:
    """Why the stack's other projects would not accept ``project`` at ``new_version``."""
    moved = dataclasses.replace(project, version=new_version)
    projects = [moved if p.key == project.key else p for p in stack.projects]
    return [f"{problem.what} ({problem.where})" for other in projects if other is not moved
            for problem in coordinated_pin_problems(stack.path, other, projects)]


def check_pins(stack: Stack, project: Project, new_version: str) -> None:
    """Refuse, before anything is downloaded, a version the stack's other pins reject."""
    found = pins_refusing(stack, project, new_version)
    if not found:
        return
    others = [p for p in stack.projects if p.key != project.key and any(
        pinned_for(r, stack.projects) is project for r in p.upstream_requires)]
    fix = (f"choose the {project.distribution} release that "
           + " and ".join(f"{o.distribution} {o.version}" for o in others)
           + " pins, or bump "
           + " / ".join(f"`{command('bump', stack.name, o.key, 'VERSION')}`" for o in others)
           + f" to a release that pins {project.distribution} {new_version} (it moves "
           f"{project.key} with it)")
    raise MaintenanceError(
        f"{project.distribution} {new_version} would break the stack's pins: "
        + "; ".join(found), where=f"{stack.name}/{project.key}", fix=fix)


def requirements_on_stack(stack: Stack, project: Project, release: Release) -> list[str]:
    """The new release's requirements on the stack's other projects."""
    return [str(r) for r in release.requires
            if pinned_for(r, stack.projects) not in (None, project)]


def missing_targets(project: Project, patches: Sequence[Patch], release: Release
                    ) -> dict[str, list[str]]:
    """patch name -> its target files the release does not have."""
    return {p.name: gone for p in patches
            if (gone := [rel for f in p.changed_files if (rel := project.package_path(f))
                         is not None and rel not in release.files])}


def check_layout(stacks: Sequence[Stack], stack: Stack, project: Project, new_version: str,
                 release: Release, missing: dict[str, list[str]]) -> str:
    """The layout for the new release: the project's own when it still fits; else refused
    when patches target files that moved, naming the layout that fits."""
    if not project.layout or project.layout not in LAYOUTS:
        return project.layout
    fits = fitting(release.files)
    if project.layout in fits:
        return project.layout
    if not missing:  # nothing the series changes moved: the layout that fits, if any
        return fits[0] if fits else project.layout
    gate = marker(project.layout)
    where_fits = (f"it fits the `{fits[0]}` layout ({LAYOUTS[fits[0]]})" if fits else
                  "no known layout fits it (CONTRIBUTING.md: Add an upstream layout)")
    start = _start_on_layout(stacks, project, new_version, fits[0]) if fits else ""
    raise MaintenanceError(
        f"the gate moved: {project.distribution} {new_version} has no {gate} (the "
        f"`{project.layout}` layout of stack {stack.name}); {where_fits}. The series "
        "targets files the release does not have: "
        + "; ".join(f"{name}: {', '.join(files)}" for name, files in missing.items()),
        where=f"{stack.name}/{project.key}",
        fix=f"port the series to the layout that fits{start}")


def _start_on_layout(stacks: Sequence[Stack], project: Project, new_version: str,
                     layout: str) -> str:
    """The step after a gate-moved refusal: build the stack on ``layout`` that pins
    ``new_version``, else copy one on it under a free name."""
    on_it = sorted(((s, p) for s in stacks for p in s.projects
                    if p.layout == layout and p.distribution == project.distribution),
                   key=lambda sp: sp[0].name)
    if not on_it:
        return ""
    pinned = [s.name for s, p in on_it if Version(p.version) == Version(new_version)]
    if pinned:
        return (f"; stack {pinned[0]} already pins {project.distribution} {new_version} on "
                f"that layout: `{command('build', '--stack', pinned[0])}`")
    taken = {s.name for s in stacks}
    base = f"{project.key}-{new_version}"
    name = next(n for n in (base, *(f"{base}-{i}" for i in range(2, len(taken) + 3)))
                if n not in taken)
    source, copied = on_it[0]
    return ("; start from a stack on that layout: "
            f"`{command('bump', source.name, copied.key, new_version, '--new-stack', name)}`")
