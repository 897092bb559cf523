"""Does a stack declare every wheel of the release it pins?  An undeclared one (a new
Python or platform) has no patched build, so pip cannot resolve ours there."""

from __future__ import annotations

from packaging.version import Version

from sm120fork.declare import Project
from sm120fork.errors import ToolkitError
from sm120fork.fetch.index import ProjectPage, project_page
from sm120fork.fetch.kinds import source_kind


def ships_wheels(project: Project) -> bool:
    """Its kind's input is published wheels, or it pins the ones an empty series ships."""
    return source_kind(project.source).ships_wheels or bool(project.wheels)


def release_wheels(project: Project, page: ProjectPage, version: str | None = None
                   ) -> tuple[str, ...]:
    """The index's wheels of ``project`` at ``version`` (default: its pin), not yanked."""
    wanted = Version(version or project.version)
    return tuple(sorted(f.filename for v, f in page.files_of(project, wheels=True)
                        if v == wanted and not f.yanked))


def undeclared_wheels(project: Project, page: ProjectPage, version: str | None = None
                      ) -> tuple[str, ...]:
    """Wheels of the release a project that ships published wheels does not declare (one
    built from source misses none)."""
    if not ships_wheels(project):
        return ()
    declared = {w.filename for w in project.wheels}
    return tuple(f for f in release_wheels(project, page, version) if f not in declared)


def release_check(project: Project) -> tuple[tuple[str, ...], str]:
    """(undeclared wheels, summary) of the pinned release, as ``status`` and ``bump`` say it."""
    if not ships_wheels(project):
        return (), ""
    try:
        undeclared = undeclared_wheels(project, project_page(project))
    except ToolkitError as exc:
        return (), f"not checked: {exc.message}"
    if undeclared:
        return undeclared, f"{len(undeclared)} NOT DECLARED: {', '.join(undeclared)}"
    return (), "all declared"
