"""How a project's wheels are made (:func:`kind_for`, from its source kind's answers):
built, repacked or as published, each checked, with their manifest entries."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sm120fork import __version__
from sm120fork.declare import Project, Stack, WheelPin
from sm120fork.errors import BuildError, VerifyError
from sm120fork.fetch.index import Progress
from sm120fork.fetch.kinds import PUBLISHED, SourceFetch, source_kind
from sm120fork.manifest import (
    UNCHECKED,
    FingerprintResult,
    ManifestEntry,
    PatchRecord,
    SourceRecord,
)
from sm120fork.package.wheel import (
    build_wheel,
    check_same_preimage,
    check_series_for_wheel,
    check_wheel,
    repack_wheel,
    require_passed,
)
from sm120fork.patch.check import check_tree, fold_steps
from sm120fork.patch.series import Series
from sm120fork.patch.tree import Tree, prepare_tree
from sm120fork.util.files import atomic_copy, sha256_file
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

@dataclass(frozen=True, kw_only=True)
class Options:
    """How to run a build's stages (the CLI's flags), resolved once like the plan."""

    force: bool = False
    rebuild: bool = False
    progress: Callable[[str], Progress | None] | None = None
    out: Path | None = None
    jobs: int = os.cpu_count() or 1
    #: Called as ``stage(project_key, what)`` as a project moves on (the CLI's progress line).
    stage: Callable[[str, str], None] = lambda project, what: None
    #: Publish without checking the patched tree (the manifest says so).
    unchecked: bool = False


@dataclass(frozen=True, kw_only=True)
class Job:
    """One project of one stack to build, with its series and kind, resolved once."""

    ws: Workspace
    stack: Stack
    project: Project
    series: Series
    kind: Build
    #: Its build cache entry for these inputs (the pin, the source and the series hashed).
    entry_dir: Path
    options: Options

    def entry(self, *, version: str, source: SourceRecord, wheel: Path, sha256: str,
              used_as_published: bool = False, patched_commit: str | None = None,
              tree: str | None = None, changed_files: tuple[str, ...] | None = None,
              artifact_check: tuple[FingerprintResult, ...] = (),
              check: str = "") -> ManifestEntry:
        """The manifest entry of one wheel: the project's and series' fields, and the kind's."""
        git = self.project.git
        return ManifestEntry(
            project=self.project.key, distribution=self.project.distribution,
            upstream_version=self.project.version, version=version,
            upstream_commit=git.commit if git else None,
            upstream_commit_verified=git.commit_verified if git else False,
            source=source, series=self.project.series, series_digest=self.series.digest,
            patches=tuple(PatchRecord(name=p.name, sha256=p.sha256, subject=p.subject,
                                      applied_upstream=p.applied_upstream)
                          for p in self.series.patches),
            wheel=wheel.name, sha256=sha256, toolkit_version=__version__,
            used_as_published=used_as_published, patched_commit=patched_commit, tree=tree,
            changed_files=changed_files, artifact_check=artifact_check, check=check)


def patched_tree(job: Job) -> tuple[Tree, str]:
    """The fork tree with the series applied, and its check's summary, or BuildError;
    with ``--unchecked`` a failure (or a check that cannot run) is published as
    :data:`UNCHECKED` and why."""
    stack, key = job.stack.name, job.project.key
    job.options.stage(key, "fetching and patching")
    made = prepare_tree(job.ws, job.stack, job.project, patches=job.series.patches,
                        force=job.options.force)
    tree = made.path
    anyway = f"`{command('build', '--stack', stack, '--unchecked')}`"
    job.options.stage(key, "checking the patched tree")
    try:
        result = check_tree(tree, job.series.patches, layout=job.project.layout,
                            cache=job.ws.state_dir / "probe")
    except VerifyError as exc:  # the probe cannot run here
        if not job.options.unchecked:
            raise BuildError(exc.what, where=exc.where, detail=exc.detail,
                             fix=f"{exc.fix}; or publish the build as unchecked: {anyway}"
                             ) from exc
        why = exc.what
    else:
        if result.passed:
            return made, result.summary
        first = result.failures[0]
        if not job.options.unchecked:
            fold = fold_steps(tree, job.series.patches, first.patch)
            raise BuildError(
                f"patch {first.patch} fails its check: {first.error} ({first.check})",
                where=first.where, detail="\n".join(
                    [*map(str, result.failures), f"check: {result.summary}"]), fix=(
                    f"mend the patch: fix it in {tree}, " + (
                        f"fold the fix into the patch: {fold}" if fold else "commit the fix")
                    + f", then `{command('refresh', stack, key)}`; or publish the build as "
                    f"unchecked (verify-sm120 and a checking build still refuse it): {anyway}"))
        why = f"fails its check: {first}"
    log.warning("%s: publishing a tree that was not checked (--unchecked): %s", key, why)
    return made, f"{UNCHECKED}: {why}"


def _from_source(job: Job, inputs: list[Path], staging: Path) -> list[ManifestEntry]:
    """An sdist or a git commit, patched in a fork tree and built with pypa/build."""
    project, key, source = job.project, job.project.key, job.kind.source
    tree, check = patched_tree(job)
    job.options.stage(key, "building the wheel")
    wheel = build_wheel(project, tree.repo, staging,
                        on_line=lambda line: job.options.stage(key, f"building: {line}"),
                        changed_files=[f for p in job.series.patches for f in p.files])
    job.options.stage(key, "checking the wheel")
    filename, url = source.origin(project)
    record = SourceRecord(kind=source.name, digest=source.digest(project), filename=filename,
                          url=url)
    return [_checked_entry(job, tree, check, wheel, record)]


def _checked_entry(job: Job, tree: Tree, check: str, wheel: Path, source: SourceRecord,
                   changed_files: tuple[str, ...] | None = None) -> ManifestEntry:
    """The entry of a wheel made from the patched ``tree``, once its artifact check passed."""
    results = check_wheel(wheel, job.project, job.series, tree.repo)
    require_passed(results, job.project)
    return job.entry(version=job.project.local_version, source=source, wheel=wheel,
                     sha256=sha256_file(wheel), patched_commit=tree.state.head,
                     tree=tree.repo.tree_hash(), changed_files=changed_files,
                     artifact_check=tuple(results), check=check)


def _record_of(pin: WheelPin) -> SourceRecord:
    return SourceRecord(kind=PUBLISHED.name, digest=pin.sha256, filename=pin.filename,
                        url=pin.url or None)


def _repacked(job: Job, inputs: list[Path], staging: Path) -> list[ManifestEntry]:
    """Published wheels, the series applied to a tree laid out like the repository and
    each wheel repacked with the changed files (``source = "wheel"``)."""
    project, series = job.project, job.series
    changed = check_series_for_wheel(project, series, inputs[0], stack=job.stack.name)
    for other in inputs[1:]:
        check_same_preimage(inputs[0], other, list(changed.values()))
    tree, check = patched_tree(job)
    replacements = {member: (tree.path / path).read_bytes() for path, member in changed.items()}
    epoch = str(tree.repo.commit_time())
    entries = []
    for pin, original in zip(project.wheels, inputs, strict=True):
        job.options.stage(project.key, f"repacking {original.name}")
        wheel = repack_wheel(project, original, replacements, staging, source_date_epoch=epoch)
        entries.append(_checked_entry(job, tree, check, wheel, _record_of(pin),
                                      tuple(sorted(changed.values()))))
    return entries


def _as_published(job: Job, inputs: list[Path], staging: Path) -> list[ManifestEntry]:
    """An empty series and pinned published wheels: they ship byte for byte."""
    entries = []
    for pin, original in zip(job.project.wheels, inputs, strict=True):
        atomic_copy(original, staging / original.name)
        entries.append(job.entry(version=job.project.version, wheel=original,
                                 sha256=pin.sha256, source=_record_of(pin),
                                 used_as_published=True))
        log.info("%s: %s used as published (sha256 %s)", job.project.key, pin.filename,
                 pin.sha256[:12])
    return entries


@dataclass(frozen=True)
class Build:
    """How a project's wheels are made from what its source kind downloads: ``make``
    builds and checks them into a staging folder and returns their entries."""

    source: SourceFetch
    make: Callable[[Job, list[Path], Path], list[ManifestEntry]]
    #: It patches a fork tree, whose local work a cached build must not leave out.
    has_tree: bool = True


def kind_for(project: Project, series: Series) -> Build:
    """As published (empty series, pinned wheels), repacked (the kind ships wheels), or
    built from source."""
    if not series.patches and project.wheels:
        return Build(PUBLISHED, _as_published, has_tree=False)
    source = source_kind(project.source)
    return Build(source, _repacked if source.ships_wheels else _from_source)
