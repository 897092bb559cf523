"""A stack resolved once where a command starts and handed down: its declaration, series,
upstream-form tests, the build's manifest and what that build tested."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sm120fork import manifest as manifest_file
from sm120fork.declare import Stack
from sm120fork.errors import ConfigError, ToolkitError
from sm120fork.manifest import Manifest
from sm120fork.patch.series import Series, load_series
from sm120fork.record import Tested, TestedPatch, TestedTree
from sm120fork.util.files import sha256_file
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

#: The folder beside a series that holds its upstream-form tests (upstream/groups.py).
UPSTREAM_TESTS = "upstream-tests"


@dataclass(frozen=True, kw_only=True)
class ResolvedStack:
    """What a stack is today: each project's series, and its built wheels if any (each read
    once, when first asked for)."""

    ws: Workspace
    stack: Stack
    #: Where the build's manifest is (or would be).
    manifest_path: Path

    @classmethod
    def named(cls, ws: Workspace, name: str | None, *, strict: bool = True) -> ResolvedStack:
        """The stack ``name`` (default: the default one), resolved: where a command starts."""
        return cls.of(ws, ws.stack(name, strict=strict))

    @classmethod
    def of(cls, ws: Workspace, stack: Stack, *, wheels_dir: Path | None = None
           ) -> ResolvedStack:
        """``stack``, its build's manifest in ``wheels_dir`` (default ``wheels/<stack>/``)."""
        folder = wheels_dir or ws.stack_wheels(stack.name)
        return cls(ws=ws, stack=stack, manifest_path=folder / manifest_file.FILE)

    @cached_property
    def series(self) -> Mapping[str, Series]:
        return {p.key: load_series(self.ws.series_dir(p)) for p in self.stack.projects}

    @cached_property
    def upstream_tests(self) -> Mapping[str, Series]:
        """project -> the upstream-form tests beside its series, which an upstream PR applies
        with its patches; nothing of them is built."""
        dirs = {p.key: self.ws.series_dir(p) / UPSTREAM_TESTS for p in self.stack.projects}
        return {k: load_series(d) for k, d in dirs.items() if (d / "series").is_file()}

    @cached_property
    def built(self) -> Manifest | None:
        """The build's manifest as read (None: no readable one; it may be of another stack)."""
        return manifest_file.load(self.manifest_path)

    @cached_property
    def plugin(self) -> frozenset[str] | None:
        """sha256 of each plugin wheel built beside it (``plugin/``); None: none built."""
        wheels = sorted((self.folder / "plugin").glob("*.whl"))
        return frozenset(sha256_file(w) for w in wheels) if wheels else None

    @property
    def name(self) -> str:
        return self.stack.name

    @property
    def folder(self) -> Path:
        return self.manifest_path.parent

    @property
    def manifest(self) -> str:
        """Where the manifest is, as a report shows it (relative to the checkout)."""
        path = self.manifest_path
        return path.relative_to(self.ws.root).as_posix() if path.is_relative_to(self.ws.root) \
            else path.name

    @cached_property
    def wheels(self) -> Mapping[str, tuple[frozenset[str], str | None]] | None:
        """project -> (sha256 of each published wheel, patched tree) of this stack's build;
        None when it is not built."""
        built = self.built
        if built is None or built.stack != self.name:
            return None
        return {project: (frozenset(w.sha256 for w in entries),
                          next((w.tree for w in entries if w.tree), None))
                for project in dict.fromkeys(w.project for w in built.wheels)
                if (entries := built.of(project))}

    def build(self) -> Manifest:
        """The build's manifest, refused (naming the build command) when there is none."""
        fix = command("build", "--stack", self.name)
        if not self.manifest_path.is_file():
            raise ConfigError(f"stack {self.name} has no build in {self.folder}", fix=fix)
        return manifest_file.read(self.manifest_path, fix=fix)

    def tested(self) -> Tested:
        """The record's ``tested`` block of the build; without the patch ids where they
        cannot be computed here (no git): the run goes on, and its record names the wheels
        and trees only (a verify then calls it stale)."""
        manifest = self.build()
        try:
            ids = {k: s.patch_ids for k, s in self.series.items()}
        except (ToolkitError, OSError) as exc:
            log.warning("the record will name no patch ids: %s", exc)
            ids = {}
        return tested_of(manifest, ids)


def tested_of(manifest: Manifest,
              patch_ids: Mapping[str, Sequence[tuple[str, str]]]) -> Tested:
    """The ``tested`` block of a build: trees from its manifest, each patch the build
    applied with its id (``patch_ids``: project -> (file name, patch id) of the series now;
    a patch whose file changed since the build is left out, and a record then is stale)."""
    trees, patches = [], []
    for entry in manifest.wheels:
        if entry.used_as_published:
            continue
        if entry.tree:
            trees.append(TestedTree(project=entry.project, tree=entry.tree))
        ids = dict(patch_ids.get(entry.project, ()))
        patches += [TestedPatch(project=entry.project, patch=p.name, patch_id=ids[p.name])
                    for p in entry.patches if p.name in ids]
    # one entry per tree and patch, however many wheels (platforms, Pythons) a build made
    return Tested(trees=tuple(dict.fromkeys(trees)), patches=tuple(dict.fromkeys(patches)))
