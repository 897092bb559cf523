"""Keeping the fork alive: ``status``, ``bump`` and ``refresh``.

- ``status``: every patch of every stack against its pin: does it apply, what its DEP-3
  header says about upstream, is its fingerprint already upstream, which wheel shipped it.
- ``bump``: re-pin one project and re-classify each patch on the new upstream (still
  needed / upstreamed identically / upstreamed differently / conflict).  A conflict stops
  like ``git am``: the fork tree holds the conflict markers, ``--continue`` resumes and
  ``--abort`` restores the previous tree, pin and series byte for byte.
- ``refresh``: export the fork tree's commits back into the series in the canonical
  ``git format-patch`` form; a refresh with no change writes nothing.

Nothing here prints: results are dataclasses that the command line renders.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email.utils
import fnmatch
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import (
    InvalidSdistFilename,
    canonicalize_name,
    parse_sdist_filename,
)
from packaging.version import InvalidVersion, Version

from sm120fork.declare import GitPin, Project, SdistPin, Stack
from sm120fork.errors import (
    CommandError,
    ConfigError,
    DirtyTreeError,
    MaintenanceError,
    SourceError,
)
from sm120fork.fetch import UPSTREAM_TAG, download_sdist, index_url, source_key
from sm120fork.patch import apply_series, check_series
from sm120fork.pipeline import load_manifest
from sm120fork.proc import Git
from sm120fork.series import (
    Fingerprint,
    Patch,
    Series,
    load_series,
    parse_patch,
    read_series_file,
)
from sm120fork.tree import TreeState, open_tree, prepare_tree, read_state, write_state
from sm120fork.verify import upstream_text
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

#: The canonical export (patches/README.md); refresh writes exactly this.
FORMAT_PATCH = ("format-patch", "--zero-commit", "--no-signature", "--full-index",
                "--no-numbered", "--stat=80", "--stat-graph-width=20")
_SHA1 = re.compile(r"[0-9a-f]{40}")
_COMMIT_IN_SOURCE = re.compile(
    r"""(?:__git_commit__|git_commit|__git_version__|git_version|__commit__)\s*[:=]\s*"""
    r"""["']([0-9a-f]{40})["']""")
_CONFLICT_MARK = re.compile(r"^(<<<<<<<|>>>>>>>) ", re.MULTILINE)
BEFORE_REF = "refs/sm120fork/before-bump"
BEFORE_BASE_REF = "refs/sm120fork/before-bump-base"

STILL_NEEDED = "still needed"
UPSTREAMED_IDENTICALLY = "upstreamed identically"
UPSTREAMED_DIFFERENTLY = "upstreamed differently"
CONFLICT = "conflict"
RESOLVED = "conflict, resolved by hand"
DROPPED_BY_HAND = "conflict, dropped by hand"
UPSTREAMED = (UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY)


# --------------------------------------------------------------------------- helpers
def _today() -> str:
    return os.environ.get("SM120FORK_TODAY") or dt.datetime.now(dt.UTC).date().isoformat()


def pinned_upstream(ws: Workspace, stack: Stack, project: Project) -> Git:
    """A git repo whose ``upstream`` tag is the project's pinned upstream.

    The fork tree serves when it is at this pin (its work tree is not touched: only the
    tag is read); otherwise a pristine ``@upstream`` tree is made next to it.
    """
    work = ws.work_tree(stack, project)
    state = read_state(work) if work.exists() else None
    if state is not None and state.source == source_key(project):
        return Git(work)
    return prepare_tree(ws, stack, project, patches=(), variant="upstream", force=True).repo


def effect_check(repo: Git, patch: Patch, rev: str = UPSTREAM_TAG) -> tuple[bool, list[str]]:
    """Is the patch's effect present at ``rev``?  Returns (verdict, evidence lines).

    ``Effect`` lines must all be found and ``Effect-Absent`` lines all missing; without
    either, every ``Fingerprint`` must be found literally.
    """
    texts: dict[str, str] = {}

    def text(path: str) -> str:
        if path not in texts:
            texts[path] = upstream_text(repo, path, rev)
        return texts[path]

    def found(eff: Fingerprint) -> bool:
        if "*" not in eff.path:
            return eff.found_in(text(eff.path))
        prefix = eff.path.split("*", 1)[0].rpartition("/")[0]
        names = repo("ls-tree", "-r", "--name-only", rev, "--", *([prefix] if prefix else []),
                     quiet=True).splitlines()
        return any(eff.found_in(text(n)) for n in names if fnmatch.fnmatchcase(n, eff.path))

    evidence: list[str] = []
    ok = True
    if patch.effects or patch.effects_absent:
        for eff in patch.effects:
            hit = found(eff)
            ok &= hit
            evidence.append(f"Effect {eff}: {'present' if hit else 'ABSENT'}")
        for eff in patch.effects_absent:
            hit = found(eff)
            ok &= not hit
            evidence.append(f"Effect-Absent {eff}: {'PRESENT' if hit else 'absent'}")
    else:
        for fp in patch.fingerprints:
            hit = fp.text in text(fp.path)
            ok &= hit
            evidence.append(f"Fingerprint {fp}: {'present' if hit else 'absent'}")
    return ok, evidence


def fingerprints_upstream(repo: Git, patch: Patch, rev: str = UPSTREAM_TAG) -> int:
    """How many of the patch's fingerprints are already in upstream at ``rev``."""
    return sum(fp.text in upstream_text(repo, fp.path, rev) for fp in patch.fingerprints)


def applied_upstream_version(patch: Patch) -> Version | None:
    """The release named first in ``Applied-Upstream`` (``0.6.17, <url>``), if any."""
    token = re.split(r"[,\s]+", patch.applied_upstream.strip(), maxsplit=1)[0]
    try:
        return Version(token.removeprefix("v")) if token else None
    except InvalidVersion:
        return None


# --------------------------------------------------------------------------- status
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

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


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

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["patches"] = [p.to_json() for p in self.patches]
        return d


def _wheel_for(manifest: dict[str, Any] | None, stack: Stack, project: Project,
               patch: Patch) -> str:
    if not manifest or manifest.get("stack") != stack.name:
        return "-"
    for entry in manifest.get("wheels", []):
        if entry.get("project") != project.key:
            continue
        for p in entry.get("patches", []):
            if p.get("name") == patch.name:
                same = p.get("sha256") == patch.sha256
                return str(entry["wheel"]) + ("" if same else " (patch changed since)")
        return "-"
    return "-"


def project_status(ws: Workspace, stack: Stack, project: Project,
                   manifest: dict[str, Any] | None) -> ProjectStatus:
    pending = BumpState.load(ws, stack.name, project.key)
    in_progress = f"to {pending.new_version}" if pending else ""

    def result(patches: tuple[PatchStatus, ...], error: str = "") -> ProjectStatus:
        return ProjectStatus(stack=stack.name, default=stack.default, project=project.key,
                             version=project.version, source=project.source,
                             series=project.series, patches=patches,
                             bump_in_progress=in_progress, error=error)
    try:
        series = load_series(ws.series_dir(project))
        repo = pinned_upstream(ws, stack, project)
    except (ConfigError, SourceError, CommandError, MaintenanceError) as exc:
        return result((), exc.message)
    except Exception as exc:  # a SeriesError etc.: show it in the table, keep going
        message = getattr(exc, "message", str(exc))
        return result((), message)
    failures = check_series(repo, series)
    failed_at = series.names().index(failures[0].patch) if failures else len(series.patches)
    rows: list[PatchStatus] = []
    for i, p in enumerate(series.patches):
        if i < failed_at:
            applies = "yes"
        elif i == failed_at:
            applies = f"NO: {failures[0].file}, {failures[0].hunk}"
        else:
            applies = "not checked"
        n = fingerprints_upstream(repo, p)
        total = len(p.fingerprints)
        fp = "absent" if n == 0 else ("PRESENT" if n == total else f"partly ({n}/{total})")
        if p.effects or p.effects_absent:
            present, _ = effect_check(repo, p)
            effect = "present" if present else "absent"
        else:
            effect = "-"
        rows.append(PatchStatus(
            patch=p.name, subject=p.subject, applies=applies, forwarded=p.field("Forwarded"),
            applied_upstream=p.applied_upstream, bug_upstream=p.field("Bug-Upstream"),
            fingerprint_upstream=fp, effect_upstream=effect,
            wheel=_wheel_for(manifest, stack, project, p)))
    return result(tuple(rows))


def status(ws: Workspace, stack_name: str | None = None,
           wheels_dir: Path | None = None) -> list[ProjectStatus]:
    """The status of every project of every stack (or of ``stack_name``).

    The wheel column comes from ``wheels/manifest.json``, or from ``wheels_dir`` for a
    stack published elsewhere with ``build --out``.
    """
    stacks = [ws.stack(stack_name)] if stack_name else sorted(
        ws.stacks().values(), key=lambda s: (not s.default, s.name))
    if wheels_dir is None:
        manifest = load_manifest(ws)
    else:
        try:
            manifest = json.loads((wheels_dir / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError("no readable manifest.json", where=str(wheels_dir)) from exc
    with ws.lock():
        return [project_status(ws, s, p, manifest) for s in stacks for p in s.projects]


# --------------------------------------------------------------------------- refresh
@dataclass(frozen=True, kw_only=True)
class RefreshResult:
    stack: str
    project: str
    directory: Path
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    series_rewritten: bool

    @property
    def wrote_anything(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.series_rewritten)


_DATE_LINE = re.compile(r"^Date: .*$", re.MULTILINE)


def _canonical_date(text: str, last_update: str) -> str:
    """Set the header's ``Date:`` to the patch's Last-Update day, 00:00:00 UTC."""
    day = dt.datetime.fromisoformat(last_update).replace(tzinfo=dt.UTC)
    stamp = email.utils.format_datetime(day)
    return _DATE_LINE.sub(f"Date: {stamp}", text, count=1)


def export_series(repo: Git, directory: Path, base: str = UPSTREAM_TAG,
                  stack: str = "", project: str = "") -> RefreshResult:
    """Write ``base..HEAD`` of ``repo`` as the series in ``directory``; touch only changes."""
    with tempfile.TemporaryDirectory(prefix="sm120fork-refresh-") as tmp:
        out = repo(*FORMAT_PATCH, "-o", tmp, f"{base}..HEAD")
        exported = [Path(line) for line in out.splitlines() if line.strip()]
        new: dict[str, bytes] = {}
        for path in exported:
            text = path.read_text(encoding="utf-8")
            patch = parse_patch(path)  # refuses a commit without a DEP-3 header
            text = _canonical_date(text, patch.field("Last-Update"))
            new[path.name] = text.encode("utf-8")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        old_names = read_series_file(directory)
    except Exception:
        old_names = []
    on_disk = {p.name for p in directory.glob("*.patch")}
    added: list[str] = []
    changed: list[str] = []
    unchanged: list[str] = []
    for name, data in new.items():
        target = directory / name
        if target.is_file() and target.read_bytes() == data:
            unchanged.append(name)
            continue
        (changed if target.is_file() else added).append(name)
        tmp_file = target.with_name(f".{name}.tmp")
        tmp_file.write_bytes(data)
        tmp_file.replace(target)
    removed = sorted((on_disk | set(old_names)) - set(new))
    for name in removed:
        (directory / name).unlink(missing_ok=True)
    series_file = directory / "series"
    rewritten = False
    if old_names != list(new) or not series_file.is_file():
        header = []
        if series_file.is_file():
            for line in series_file.read_text(encoding="utf-8").splitlines():
                if line.startswith("#") or not line.strip():
                    header.append(line)
                else:
                    break
        series_file.write_text("".join(f"{h}\n" for h in header)
                               + "".join(f"{n}\n" for n in new), encoding="utf-8")
        rewritten = True
    return RefreshResult(stack=stack, project=project, directory=directory,
                         added=tuple(added), removed=tuple(removed), changed=tuple(changed),
                         unchanged=tuple(unchanged), series_rewritten=rewritten)


def _reapply(ws: Workspace, stack: Stack, project: Project, repo: Git, base_commit: str) -> None:
    """Rebuild the fork tree from the (new) series so it is exactly what a build makes."""
    series = load_series(ws.series_dir(project))
    skey = source_key(project)
    write_state(repo.path, TreeState(source=skey, base=base_commit, series=series.digest,
                                     head="", applied=(), complete=False))
    head = apply_series(repo, series, stack=stack.name, project=project.key)
    write_state(repo.path, TreeState(source=skey, base=base_commit, series=series.digest,
                                     head=head, applied=tuple(series.names())))


def refresh(ws: Workspace, stack_name: str, project_key: str) -> RefreshResult:
    """Export the fork tree's commits into the project's series."""
    stack = ws.stack(stack_name)
    project = stack.project(project_key)
    with ws.lock():
        if BumpState.load(ws, stack.name, project.key):
            raise MaintenanceError(
                "a bump of this project is in progress", where=f"{stack.name}/{project.key}",
                fix=f"finish it: bump {stack.name} {project.key} --continue (or --abort)")
        tree = open_tree(ws, stack, project)
        work, state, repo = tree.path, tree.state, tree.repo
        if repo.am_in_progress():
            raise DirtyTreeError("a git am is in progress in the fork tree", where=str(work),
                                 fix="finish it (git am --continue / --abort) first")
        if repo.is_dirty():
            raise DirtyTreeError(
                "the fork tree has uncommitted changes; refresh exports commits only",
                where=str(work),
                fix="commit them (git commit, or git commit --amend into a patch's commit) "
                    "or discard them (git checkout -- .), then refresh again")
        if state.source != source_key(project):
            raise MaintenanceError("the fork tree is not at the declared pin",
                                   where=str(work), fix="run build first")
        result = export_series(repo, ws.series_dir(project), stack=stack.name,
                               project=project.key)
        series = load_series(ws.series_dir(project))
        if result.wrote_anything or state.series != series.digest or (
                repo.head() != state.head) or not state.complete:
            _reapply(ws, stack, project, repo, state.base)
        return result


# --------------------------------------------------------------------------- bump
@dataclass(frozen=True, kw_only=True)
class Classification:
    patch: str
    subject: str
    verdict: str
    evidence: tuple[str, ...]
    applied_upstream: str

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "evidence": list(self.evidence)}


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
    range_diff: str
    new_stack_created: bool


@dataclass
class BumpState:
    """A bump in progress, in ``.forks/bump/<stack>--<project>/state.json``."""

    stack: str
    project: str
    old_version: str
    new_version: str
    new_pin: dict[str, Any]
    created_stack: bool
    declaration: str
    series_dir: str
    results: list[dict[str, Any]]
    next_index: int = 0
    head: str = ""
    conflict_head: str = ""
    conflict_evidence: list[str] = dataclasses.field(default_factory=list)
    phase: str = "classify"
    started: str = ""
    command: str = ""

    @staticmethod
    def directory(ws: Workspace, stack: str, project: str) -> Path:
        return ws.state_dir / "bump" / f"{stack}--{project}"

    @classmethod
    def load(cls, ws: Workspace, stack: str, project: str) -> BumpState | None:
        path = cls.directory(ws, stack, project) / "state.json"
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, ws: Workspace) -> None:
        d = self.directory(ws, self.stack, self.project)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "state.json.tmp"
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=1))
        tmp.replace(d / "state.json")


def _index_sdist(project: Project, version: Version) -> tuple[str, str, str]:
    """(filename, sha256, url) of the ``version`` sdist on the package index (PEP 691)."""
    page = f"{index_url()}/{project.normalized_name}/"
    req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"package index answered HTTP {exc.code} for {project.distribution}",
                          where=page) from exc
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        raise SourceError(f"cannot read the package index: {exc}", where=page,
                          fix="check the network or set SM120FORK_INDEX_URL") from exc
    seen: list[Version] = []
    for entry in data.get("files", []):
        filename = str(entry.get("filename", ""))
        try:
            name, ver = parse_sdist_filename(filename)
        except InvalidSdistFilename:
            continue
        if canonicalize_name(name) != project.normalized_name:
            continue
        seen.append(ver)
        if ver == version:
            sha = entry.get("hashes", {}).get("sha256", "")
            if not sha:
                raise SourceError(f"the index lists no sha256 for {filename}", where=page)
            if entry.get("yanked"):
                raise SourceError(f"{filename} is yanked on the package index", where=page,
                                  fix="choose another release")
            return filename, sha, urllib.parse.urljoin(page, str(entry["url"]))
    recent = ", ".join(str(v) for v in sorted(set(seen))[-6:]) or "none"
    raise SourceError(f"{project.distribution} {version} has no sdist on the package index "
                      "(unknown version?)", where=page, fix=f"recent sdists: {recent}")


def _commit_from_sdist(sdist: Path) -> str:
    """The git commit an sdist records about itself (FlashInfer's _build_meta.py), or ''."""
    try:
        with tarfile.open(sdist, "r|*") as tf:
            for member in tf:
                parts = member.name.split("/")
                if not member.isfile() or len(parts) > 4 or parts[-1] not in (
                        "_build_meta.py", "_version.py", "version.py", "git_version.py"):
                    continue
                f = tf.extractfile(member)
                if f is None:
                    continue
                m = _COMMIT_IN_SOURCE.search(f.read(65536).decode("utf-8", errors="replace"))
                if m:
                    return m.group(1)
    except (tarfile.TarError, OSError):
        return ""
    return ""


def _toml_value(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False)


def set_toml_values(text: str, table: str, values: dict[str, str | bool | None],
                    where: str = "") -> str:
    """Set (or with None remove) ``key = value`` lines in ``[table]``, keeping comments."""
    lines = text.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == f"[{table}]")
    except StopIteration:
        raise ConfigError(f"no [{table}] table", where=where) from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")),
               len(lines))
    remaining = dict(values)
    last_key = start
    for i in range(start + 1, end):
        m = re.match(r"\s*([A-Za-z0-9_-]+)\s*=", lines[i])
        if not m:
            continue
        last_key = i
        if m.group(1) in remaining:
            value = remaining.pop(m.group(1))
            lines[i] = "" if value is None else f"{m.group(1)} = {_toml_value(value)}\n"
    extra = [f"{k} = {_toml_value(v)}\n" for k, v in remaining.items() if v is not None]
    lines[last_key + 1:last_key + 1] = extra
    return "".join(lines)


def _project_tables(text: str, key: str) -> str:
    """The text of ``[projects.<key>]`` and its sub-tables."""
    out: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped in (f"[projects.{key}]",) or stripped.startswith(
                f"[projects.{key}.")
        if inside:
            out.append(line)
    while out and (not out[-1].strip() or out[-1].lstrip().startswith("#")):
        out.pop()
    return "".join(out)


def _create_stack(ws: Workspace, source: Stack, project: Project, name: str) -> Stack:
    """A one-project stack ``name`` copied from ``source`` (declaration and series)."""
    target = ws.forks_dir / f"{name}.toml"
    if target.exists():
        raise MaintenanceError(f"stack {name!r} already exists", where=str(target),
                               fix="bump it directly, or choose another --new-stack name")
    if project.requires:
        raise MaintenanceError(f"project {project.key} requires {', '.join(project.requires)};"
                               " --new-stack copies a single project", where=source.name)
    series_rel = f"patches/{name}/{project.key}"
    if (ws.root / series_rel).exists():
        raise MaintenanceError("series directory already exists", where=series_rel)
    tables = _project_tables(source.path.read_text(encoding="utf-8"), project.key)
    text = (f"# Copied from forks/{source.path.name} by `bump --new-stack {name}` to follow\n"
            f"# {project.distribution} past the release that stack pins; not the default.\n\n"
            f"[stack]\nname = {_toml_value(name)}\ndefault = false\n"
            f"description = {_toml_value(f'{project.distribution} fork, bumped from stack ' + source.name)}\n\n"  # noqa: E501
            f"{tables}\n")
    text = set_toml_values(text, f"projects.{project.key}", {"series": series_rel},
                           where=str(target))
    shutil.copytree(ws.series_dir(project), ws.root / series_rel)
    target.write_text(text, encoding="utf-8")
    return ws.stack(name)


def _new_project(project: Project, state: BumpState) -> Project:
    pin = state.new_pin
    return dataclasses.replace(
        project, version=state.new_version, source=pin["source"],
        git=GitPin(**pin["git"]), sdist=SdistPin(**pin["sdist"]))


def _declaration_with_pin(text: str, project: Project, state: BumpState, where: str) -> str:
    pin = state.new_pin
    key = project.key
    text = set_toml_values(text, f"projects.{key}",
                           {"version": state.new_version, "source": pin["source"]}, where)
    git = pin["git"]
    text = set_toml_values(text, f"projects.{key}.git", {
        "url": git["url"], "tag": git["tag"], "commit": git["commit"],
        "commit_verified": bool(git["commit_verified"]), "note": git["note"] or None}, where)
    sd = pin["sdist"]
    return set_toml_values(text, f"projects.{key}.sdist", {
        "filename": sd["filename"], "sha256": sd["sha256"], "url": sd["url"] or None}, where)


def _state_paths(ws: Workspace, state: BumpState) -> tuple[Path, Path, Path]:
    d = BumpState.directory(ws, state.stack, state.project)
    return d, d / "series", d / "declaration.toml"


def bump(ws: Workspace, stack_name: str, project_key: str, revision: str, *,
         allow_downgrade: bool = False, new_stack: str | None = None,
         version: str | None = None, git_commit: str | None = None) -> BumpResult:
    """Re-pin ``project_key`` of ``stack_name`` to ``revision`` (a version or a git SHA)."""
    with ws.lock():
        target_stack = new_stack or stack_name
        pending = BumpState.load(ws, target_stack, project_key)
        if pending is not None:
            wanted = version or revision
            if wanted not in (pending.new_version, pending.new_pin["git"]["commit"]):
                raise MaintenanceError(
                    f"a bump to {pending.new_version} is in progress",
                    where=f"{target_stack}/{project_key}",
                    fix="finish it with --continue or undo it with --abort")
            return _resume(ws, pending)
        stack = ws.stack(stack_name)
        project = stack.project(project_key)
        old = Version(project.version)
        if _SHA1.fullmatch(revision):
            if not version:
                raise MaintenanceError("bumping to a git commit needs --version",
                                       fix="pass the PEP 440 version of that commit")
            new_version = version
            new_pin: dict[str, Any] = {
                "source": "git",
                "git": {"url": project.git.url, "tag": "", "commit": revision,
                        "commit_verified": True, "note": ""},
                "sdist": dataclasses.asdict(project.sdist)}
        else:
            new_version = version or revision
            new_pin = {}
        try:
            new = Version(new_version)
        except InvalidVersion:
            raise ConfigError(f"{new_version!r} is neither a PEP 440 version nor a 40-hex "
                              "git commit SHA", where="bump") from None
        if new.local is not None:
            raise ConfigError("give the upstream version, without a local label",
                              where="bump")
        if new == old and not new_pin:
            raise MaintenanceError(f"{project.key} is already pinned to {project.version}",
                                   where=stack.name)
        if new < old and not allow_downgrade:
            raise MaintenanceError(f"{new_version} is older than the pinned {project.version}",
                                   where=f"{stack.name}/{project.key}",
                                   fix="pass --allow-downgrade if you mean it")
        if not new_pin:
            filename, sha256, url = _index_sdist(project, new)
            probe = dataclasses.replace(
                project, version=new_version,
                sdist=SdistPin(filename=filename, sha256=sha256, url=url))
            sdist = download_sdist(probe, ws.sdist_cache)
            commit = git_commit or _commit_from_sdist(sdist)
            if not commit:
                raise MaintenanceError(
                    f"the git commit of {project.distribution} {new_version} is unknown",
                    fix="pass --git-commit SHA (the sdist records none and the upstream "
                        "repository is not consulted)")
            note = ("commit given with --git-commit" if git_commit else
                    "commit recorded in the sdist's own build metadata")
            new_pin = {
                "source": project.source,
                "git": {"url": project.git.url,
                        "tag": project.git.tag.replace(project.version, new_version)
                        if project.version in project.git.tag else f"v{new_version}",
                        "commit": commit, "commit_verified": False,
                        "note": f"{note}; not checked against the upstream repository"},
                "sdist": {"filename": filename, "sha256": sha256, "url": ""}}
        created = False
        if new_stack:
            stack = _create_stack(ws, stack, project, new_stack)
            project = stack.project(project_key)
            created = True
        # Keep the fork tree as it is now (old pin + series) to restore on --abort and
        # to give `git am --3way` the blobs the patches were written against.
        try:
            old_tree = prepare_tree(ws, stack, project)
        except BaseException:
            if created:  # leave nothing behind: the new stack is only a copy so far
                (ws.forks_dir / f"{stack.name}.toml").unlink(missing_ok=True)
                shutil.rmtree(ws.series_dir(project), ignore_errors=True)
                shutil.rmtree(ws.work_tree(stack, project), ignore_errors=True)
            raise
        state = BumpState(
            stack=stack.name, project=project.key, old_version=project.version,
            new_version=new_version, new_pin=new_pin, created_stack=created,
            declaration=str(stack.path), series_dir=str(ws.series_dir(project)),
            results=[], started=_today(), command=" ".join(
                ["python -m sm120fork bump", stack_name, project_key, revision,
                 *(["--new-stack", new_stack] if new_stack else []),
                 *(["--version", version] if version else []),
                 *(["--allow-downgrade"] if allow_downgrade else [])]))
        d, series_backup, decl_backup = _state_paths(ws, state)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        shutil.copytree(ws.series_dir(project), series_backup)
        shutil.copyfile(stack.path, decl_backup)
        pre = ws.work_tree(stack, project, "pre-bump")
        if pre.exists():
            shutil.rmtree(pre)
        state.save(ws)
        os.replace(old_tree.path, pre)
        try:
            tree = prepare_tree(ws, stack, _new_project(project, state), patches=())
        except BaseException:
            shutil.rmtree(ws.work_tree(stack, project), ignore_errors=True)
            os.replace(pre, ws.work_tree(stack, project))
            shutil.rmtree(d, ignore_errors=True)
            if created:
                _remove_created_stack(ws, state)
            raise
        _start_new_tree(ws, stack, project, state, tree.repo)
        return _resume(ws, state)


def _start_new_tree(ws: Workspace, stack: Stack, project: Project, state: BumpState,
                    repo: Git | None = None) -> None:
    """The fork tree at the new upstream, with the old series' commits fetched beside it."""
    if repo is None:  # a run killed while unpacking the new upstream: start it again
        repo = prepare_tree(ws, stack, _new_project(project, state), patches=(),
                            force=True).repo
    pre = ws.work_tree(stack, project, "pre-bump")
    repo("fetch", "--quiet", "--no-tags", str(pre),
         f"+HEAD:{BEFORE_REF}", f"+refs/tags/{UPSTREAM_TAG}:{BEFORE_BASE_REF}")
    state.head = repo.head()
    state.save(ws)


def _remove_created_stack(ws: Workspace, state: BumpState) -> None:
    Path(state.declaration).unlink(missing_ok=True)
    series = Path(state.series_dir)
    shutil.rmtree(series, ignore_errors=True)
    parent = series.parent
    if parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()


def _series_before(ws: Workspace, state: BumpState) -> Series:
    _, series_backup, _ = _state_paths(ws, state)
    return load_series(series_backup)


def _classify(repo: Git, patch: Patch, new_version: Version) -> tuple[str, list[str]]:
    """Classify one patch against the tree's HEAD (new upstream + patches kept so far)."""
    try:
        repo("apply", "--check", str(patch.path), quiet=True)
        applies = True
    except CommandError:
        applies = False
    if applies:
        n = fingerprints_upstream(repo, patch)
        evidence = ["applies exactly"]
        if n:
            evidence.append(f"but {n} fingerprint(s) already upstream: the artifact check "
                            "will fail; review the patch and its fingerprint")
        else:
            evidence.append("fingerprint absent upstream")
        return STILL_NEEDED, evidence
    try:
        repo("apply", "--check", "--reverse", str(patch.path), quiet=True)
        return UPSTREAMED_IDENTICALLY, ["does not apply; reverse-applies cleanly"]
    except CommandError:
        pass
    present, evidence = effect_check(repo, patch)
    evidence = ["does not apply, does not reverse-apply", *evidence]
    if not present:
        return CONFLICT, [*evidence, "effect absent upstream"]
    claimed = applied_upstream_version(patch)
    if claimed is not None and claimed > new_version:
        return CONFLICT, [*evidence, f"but Applied-Upstream names {claimed}, later than "
                          f"{new_version}: check by hand"]
    if claimed is not None:
        evidence.append(f"Applied-Upstream {claimed} <= {new_version}: agrees")
    else:
        evidence.append("no Applied-Upstream field")
    return UPSTREAMED_DIFFERENTLY, evidence


def _record(state: BumpState, patch: Patch, verdict: str, evidence: list[str]) -> None:
    state.results.append(Classification(
        patch=patch.name, subject=patch.subject, verdict=verdict, evidence=tuple(evidence),
        applied_upstream=patch.applied_upstream).to_json())


def _conflict_message(ws: Workspace, state: BumpState, patch: Patch, repo: Git) -> str:
    files = repo("diff", "--name-only", "--diff-filter=U", quiet=True).split()
    return (f"patch {patch.name} conflicts with {state.project} {state.new_version}"
            f"{': ' + ', '.join(files) if files else ''}; the fork tree {repo.path} stops at it "
            "with conflict markers in place")


def _resume(ws: Workspace, state: BumpState) -> BumpResult:
    stack = ws.stack(state.stack)
    project = stack.project(state.project)
    if not state.head:
        _start_new_tree(ws, stack, project, state)
    repo = Git(ws.work_tree(stack, project))
    series = _series_before(ws, state)
    new_version = Version(state.new_version)
    cmd = f"python -m sm120fork bump {state.stack} {state.project}"
    if state.phase == "classify":
        if state.conflict_head:
            patch = series.patches[state.next_index]
            if repo.am_in_progress():
                unmerged = repo("diff", "--name-only", "--diff-filter=U", quiet=True).split()
                marked = [f for f in sorted({*unmerged, *patch.files})
                          if (repo.path / f).is_file() and _CONFLICT_MARK.search(
                              (repo.path / f).read_text(errors="replace"))]
                if marked:
                    raise MaintenanceError(
                        f"patch {patch.name} still has conflict markers: {', '.join(marked)}",
                        where=str(repo.path),
                        fix=f"edit them, then `{cmd} --continue`; or `{cmd} --abort`")
                repo("add", "-A")
                if repo("diff", "--cached", "--name-only", "HEAD", quiet=True):
                    repo("am", "--continue")
                else:  # resolved to upstream's side: nothing left of the patch
                    repo("am", "--skip")
            if repo.head() != state.conflict_head:
                holds, _ = effect_check(repo, patch, "HEAD")
                _record(state, patch, RESOLVED, [
                    *state.conflict_evidence, "conflict resolved by hand in the fork tree",
                    "the patch's effect holds on the resolved tree" if holds else
                    "WARNING: the patch's effect does not hold on the resolved tree: review"])
            else:
                _record(state, patch, DROPPED_BY_HAND, [
                    *state.conflict_evidence,
                    "conflict resolved by dropping the patch (git am --skip)"])
            state.next_index += 1
            state.conflict_head = ""
            state.head = repo.head()
            state.save(ws)
        elif repo.am_in_progress():
            repo("am", "--abort")
        if repo.head() != state.head or repo.is_dirty():
            repo("reset", "-q", "--hard", state.head)  # a run killed mid-way: redo
            repo("clean", "-q", "-fdx")
        while state.next_index < len(series.patches):
            patch = series.patches[state.next_index]
            verdict, evidence = _classify(repo, patch, new_version)
            if verdict == STILL_NEEDED:
                repo("am", "--quiet", "--no-3way", "--keep-cr",
                     "--committer-date-is-author-date", str(patch.path))
            elif verdict == CONFLICT:
                state.conflict_head = repo.head()
                state.conflict_evidence = evidence
                state.save(ws)
                try:
                    repo("am", "--quiet", "--3way", "--keep-cr",
                         "--committer-date-is-author-date", str(patch.path))
                except CommandError:
                    raise MaintenanceError(
                        _conflict_message(ws, state, patch, repo), where=state.stack,
                        fix=f"resolve the conflicts there, then `{cmd} --continue` "
                            f"(or drop the patch with `git am --skip` there first); "
                            f"`{cmd} --abort` restores the previous pin and series",
                        detail="\n".join(evidence)) from None
                verdict = STILL_NEEDED
                evidence = [*evidence, "but merges cleanly (3-way): rebased; review it"]
                state.conflict_head = ""
            _record(state, patch, verdict, evidence)
            state.next_index += 1
            state.head = repo.head()
            state.save(ws)
        state.phase = "finalize"
        state.save(ws)
    return _finalize(ws, stack, project, repo, state)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _finalize(ws: Workspace, stack: Stack, project: Project, repo: Git,
              state: BumpState) -> BumpResult:
    d, _, decl_backup = _state_paths(ws, state)
    new_project = _new_project(project, state)
    series_dir = Path(state.series_dir)
    refreshed = export_series(repo, series_dir, stack=stack.name, project=project.key)
    decl = _declaration_with_pin(decl_backup.read_text(encoding="utf-8"), project, state,
                                 state.declaration)
    Path(state.declaration).write_text(decl, encoding="utf-8")
    stack = ws.stack(stack.name)
    project = stack.project(project.key)
    base = repo("rev-parse", UPSTREAM_TAG, quiet=True)
    _reapply(ws, stack, project, repo, base)
    range_diff = repo("range-diff", "--no-color", f"{BEFORE_BASE_REF}..{BEFORE_REF}",
                      f"{UPSTREAM_TAG}..HEAD", quiet=True)
    results = tuple(Classification(**{**r, "evidence": tuple(r["evidence"])})
                    for r in state.results)
    report = _write_bump_report(ws, stack, project, state, new_project, results, range_diff,
                                refreshed)
    changelog = _write_changelog(ws, stack, project, state, results, report)
    pre = ws.work_tree(stack, project, "pre-bump")
    shutil.rmtree(pre, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)
    return BumpResult(stack=stack.name, project=project.key, old_version=state.old_version,
                      new_version=state.new_version, classifications=results, report=report,
                      changelog=changelog, refresh=refreshed, range_diff=range_diff,
                      new_stack_created=state.created_stack)


def _write_bump_report(ws: Workspace, stack: Stack, project: Project, state: BumpState,
                       new_project: Project, results: tuple[Classification, ...],
                       range_diff: str, refreshed: RefreshResult) -> Path:
    out = ws.reports_dir / "bump"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stack.name}-{project.key}-{state.old_version}-to-{state.new_version}.md"
    git = new_project.git
    lines = [
        f"# Bump {project.distribution} {state.old_version} -> {state.new_version} "
        f"(stack {stack.name})", "",
        f"Date: {_today()}. Command: `{state.command}`"
        + (" (conflicts resolved by hand, then `--continue`)." if any(
            r.verdict in (RESOLVED, DROPPED_BY_HAND) for r in results) else "."), "",
        "## New pin", "",
        f"- sdist: `{new_project.sdist.filename}` sha256 `{new_project.sdist.sha256}` "
        "(from the package index listing; the download was checked against it)",
        f"- git: {git.url} tag `{git.tag}` commit `{git.commit}` "
        f"({'verified' if git.commit_verified else 'unverified'}"
        f"{': ' + git.note if git.note else ''})",
        f"- source used to build: {new_project.source}", "",
        "## Classification", "",
        "| patch | verdict | Applied-Upstream | evidence |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {_md_escape(r.patch)} | **{r.verdict}** | "
                     f"{_md_escape(r.applied_upstream) or '-'} | "
                     f"{'<br>'.join(_md_escape(e) for e in r.evidence)} |")
    dropped = [r for r in results if r.verdict in UPSTREAMED]
    lines += ["", "## Left the series (upstreamed)", ""]
    if dropped:
        for r in dropped:
            lines.append(f"- {r.patch} ({r.subject}): {r.verdict} in {state.new_version}"
                         f"{'; upstream: ' + r.applied_upstream if r.applied_upstream else ''}")
    else:
        lines.append("None.")
    lines += ["", "## Series after the bump", "",
              f"Directory `{Path(state.series_dir).relative_to(ws.root)}`: "
              f"{len(refreshed.added) + len(refreshed.changed) + len(refreshed.unchanged)} "
              f"patch(es); added {len(refreshed.added)}, removed {len(refreshed.removed)}, "
              f"changed {len(refreshed.changed)}, unchanged {len(refreshed.unchanged)}.", ""]
    lines += [f"- {n}" for n in (*refreshed.added, *refreshed.changed, *refreshed.unchanged)]
    lines += ["", "## Range-diff (series before -> after)", "",
              "`git range-diff before-base..before upstream..HEAD` in the fork tree:", "",
              "```", range_diff.rstrip() or "(empty: no patch left on either side)", "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _write_changelog(ws: Workspace, stack: Stack, project: Project, state: BumpState,
                     results: tuple[Classification, ...], report: Path) -> Path:
    path = ws.root / "patches" / stack.name / "CHANGELOG.md"
    title = f"# Patch series changelog: stack {stack.name}\n"
    old = path.read_text(encoding="utf-8") if path.is_file() else title
    entry = [f"## {_today()}: {project.key} {state.old_version} -> {state.new_version}", ""]
    for r in results:
        if r.verdict in UPSTREAMED:
            pr = _applied_upstream_url_text(r.applied_upstream)
            entry.append(f"- dropped {r.patch} ({r.subject}): {r.verdict} in "
                         f"{project.distribution} {state.new_version}{pr}")
        elif r.verdict == DROPPED_BY_HAND:
            entry.append(f"- dropped {r.patch} ({r.subject}) during conflict resolution")
        else:
            entry.append(f"- kept {r.patch}: {r.verdict}")
    entry += ["", f"Report: {report.relative_to(ws.root)}", ""]
    head, _, rest = old.partition("\n")
    body = rest.lstrip("\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{head}\n\n" + "\n".join(entry) + ("\n" + body if body else ""),
                    encoding="utf-8")
    return path


def _applied_upstream_url_text(field: str) -> str:
    if not field:
        return ""
    return f" (Applied-Upstream: {field})"


def bump_continue(ws: Workspace, stack_name: str, project_key: str) -> BumpResult:
    with ws.lock():
        state = BumpState.load(ws, stack_name, project_key)
        if state is None:
            raise MaintenanceError("no bump in progress", where=f"{stack_name}/{project_key}")
        return _resume(ws, state)


@dataclass(frozen=True, kw_only=True)
class AbortResult:
    stack: str
    project: str
    restored_version: str
    removed_stack: bool


def bump_abort(ws: Workspace, stack_name: str, project_key: str) -> AbortResult:
    """Undo a bump in progress: the previous fork tree, pin and series, byte for byte."""
    with ws.lock():
        state = BumpState.load(ws, stack_name, project_key)
        if state is None:
            raise MaintenanceError("no bump in progress", where=f"{stack_name}/{project_key}")
        d, series_backup, decl_backup = _state_paths(ws, state)
        stack = ws.stack(state.stack) if Path(state.declaration).is_file() else None
        work = ws.state_dir / "work" / state.stack / state.project
        pre = ws.state_dir / "work" / state.stack / f"{state.project}@pre-bump"
        if pre.exists():
            shutil.rmtree(work, ignore_errors=True)
            os.replace(pre, work)
        if state.created_stack:
            _remove_created_stack(ws, state)
            shutil.rmtree(work, ignore_errors=True)
        else:
            series_dir = Path(state.series_dir)
            shutil.rmtree(series_dir, ignore_errors=True)
            shutil.copytree(series_backup, series_dir)
            shutil.copyfile(decl_backup, state.declaration)
        shutil.rmtree(d, ignore_errors=True)
        del stack
        return AbortResult(stack=state.stack, project=state.project,
                           restored_version=state.old_version,
                           removed_stack=state.created_stack)

