"""A project's wheel: built with pypa/build from its patched fork tree's HEAD (an export,
the version stamped there, so a build killed halfway leaves nothing behind), or repacked
from a published one; then the artifact check, that every patch reached it.

Repacking (the ``wheel`` source kind) unpacks each declared wheel, replaces the files the
series changed by the fork tree's and packs it under the local version; every other file
keeps its bytes.  A series may change only non-compiled files the wheel ships (or add a
module to the package), and each wheel must ship the first one's bytes there.  The
artifact check: each ``Fingerprint`` text is in the shipped wheel's file and not in
unpatched upstream (:mod:`sm120fork.patch.series`).  Test-only variants (the
series plus ``<series dir>-test/``, e.g. F5's forced cluster size) are built into
``.forks/test-variants/<stack>/<name>/`` as ``<label>.<name>``, never published.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from email.message import Message
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from sm120fork.declare import Project
from sm120fork.errors import ArtifactCheckError, BuildError, CommandError, ConfigError, PatchError
from sm120fork.fetch.archive import is_compiled, source_members
from sm120fork.manifest import FingerprintResult
from sm120fork.patch.series import Series, fingerprint_in, load_series, match_upstream
from sm120fork.patch.tree import prepare_tree
from sm120fork.resolved import ResolvedStack
from sm120fork.util.files import dist_info, scratch_prefix
from sm120fork.util.git import Git
from sm120fork.util.proc import run
from sm120fork.util.pypa import pypa_build

log = logging.getLogger("sm120fork")
_NEW_FILE = re.compile(r"^diff --git a/(\S+) b/\1\nnew file mode ", re.MULTILINE)


def _stamp(project: Project, package_dir: Path, changed_files: Sequence[str]) -> dict[str, str]:
    """Write the local version into the exported tree (unless the build backend reads it
    from the environment: then return that) and the files the series changes, sorted, as
    the module the patched code reads (the project's ``series_record``), if declared."""
    stamp = project.version_stamp
    if not stamp.env:
        target = package_dir / stamp.file
        if not target.is_file():
            raise BuildError(f"version file {stamp.file} does not exist",
                             where=f"project {project.key}", fix="fix version_stamp.file")
        text = target.read_text(encoding="utf-8")
        pattern = re.compile(r"""(["'])""" + re.escape(project.version) + r"""\1""")
        found = pattern.findall(text)
        if len(found) != 1:
            raise BuildError(f"expected the quoted version {project.version!r} once in "
                             f"{stamp.file}, found it {len(found)} times",
                             where=f"project {project.key}")
        target.write_text(pattern.sub(
            lambda m: f"{m.group(1)}{project.local_version}{m.group(1)}", text), encoding="utf-8")
    if project.series_record:
        target = package_dir / project.series_record
        if not target.parent.is_dir():
            raise BuildError(f"series_record {project.series_record}: its folder does not "
                             "exist", where=f"project {project.key}", fix="fix series_record")
        lines = "".join(f"    {json.dumps(path)},\n" for path in sorted(set(changed_files)))
        target.write_text('"""The files this build\'s patch series changes, upstream repository '
                          'paths (written by sm120fork\'s build)."""\n\nCHANGED_FILES = (\n'
                          + lines + ")\n", encoding="utf-8")
    return {stamp.env: project.local_version} if stamp.env else {}


def build_wheel(project: Project, repo: Git, out_dir: Path,
                on_line: Callable[[str], None] | None = None,
                changed_files: Sequence[str] = ()) -> Path:
    """Build the project's wheel from HEAD of ``repo`` into ``out_dir``; return its path.

    ``on_line`` sees pypa/build's output line by line while it runs; ``changed_files``
    (the files the series' patches touch) go into the project's ``series_record``."""
    with tempfile.TemporaryDirectory(
            prefix=scratch_prefix(f"build-{project.key}", hidden=False)) as tmp:
        src = Path(tmp) / "src"
        # HEAD's tree without .git: checkout-index is git's cheapest way to write it elsewhere
        repo("read-tree", "HEAD")
        repo("checkout-index", "--all", "--force", f"--prefix={src}/")
        package_dir = src / project.package_prefix
        env = _stamp(project, package_dir, changed_files)
        # Reproducible archives: wheel/setuptools date zip entries from this.
        env["SOURCE_DATE_EPOCH"] = str(repo.commit_time())
        log.info("building %s %s", project.distribution, project.local_version)
        wheel = pypa_build(package_dir, Path(tmp) / "dist", name=project.distribution,
                           where=f"project {project.key}", env=env, on_line=on_line)
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if canonicalize_name(name) != project.normalized_name or version != Version(
                project.local_version):
            raise BuildError(f"built {wheel.name}, expected {project.distribution} "
                             f"{project.local_version}", where=f"project {project.key}",
                             fix="check version_stamp in the declaration")
        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / wheel.name
        shutil.copy2(wheel, final)
        return final


def wheel_metadata(wheel: Path) -> Message:
    """The METADATA of a wheel, parsed as the core metadata's email format."""
    return Parser().parsestr((dist_info(wheel, "METADATA") or b"").decode("utf-8"))


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The Requires-Dist entries of a wheel (from its METADATA)."""
    return [Requirement(r) for r in wheel_metadata(wheel).get_all("Requires-Dist") or []]


def wheel_extras(wheel: Path) -> set[str]:
    """The extras a wheel provides (Provides-Extra), normalised."""
    return {canonicalize_name(e) for e in wheel_metadata(wheel).get_all("Provides-Extra") or []}


def check_series_for_wheel(project: Project, series: Series, wheel: Path, *,
                           stack: str) -> dict[str, str]:
    """Refuse a series a published wheel cannot take; map each changed file to its member.

    Returns ``{repository path: wheel member}`` for every file the series changes.
    """
    shipped = set(source_members(wheel))
    with zipfile.ZipFile(wheel) as zf:
        every = {i.filename for i in zf.infolist()}
    changed: dict[str, str] = {}
    for patch in series.patches:
        where = f"stack {stack}, project {project.key}, patch {patch.name}"
        text = patch.path.read_text(encoding="utf-8", errors="replace")
        if "GIT binary patch" in text:
            raise PatchError("it carries a binary patch", where=where,
                             fix="a wheel source takes only text changes")
        added = set(_NEW_FILE.findall(text))
        for path in patch.files:
            member = project.package_path(path)
            if path in added and path.endswith(".py") and member is not None \
                    and member not in every:
                changed[path] = member  # a module the series adds to the package
                continue
            if is_compiled(path) or (member is not None and member in every
                                     and member not in shipped):
                raise PatchError(f"it changes the compiled file {path}", where=where,
                                 fix="a wheel source takes only changes to Python and other "
                                     "text files; build this project from source instead")
            if member is None or member not in shipped:
                raise PatchError(f"it changes {path}, which {wheel.name} does not ship",
                                 where=where,
                                 fix="a wheel source can only change files the wheel has; "
                                     "check the path (package_root "
                                     f"{project.package_root!r}) or build from source")
            changed[path] = member
    return changed


def check_same_preimage(primary: Path, other: Path, members: Sequence[str]) -> None:
    """``other`` ships the bytes the series was applied to (those of ``primary``)."""
    with zipfile.ZipFile(primary) as a, zipfile.ZipFile(other) as b:
        names, first = set(b.namelist()), set(a.namelist())
        for member in members:
            if member not in first and member not in names:
                continue  # a module the series adds: neither wheel has it
            if member not in names or a.read(member) != b.read(member):
                raise PatchError(
                    f"{other.name} ships another {member} than {primary.name}, on which "
                    "the series was applied", where=str(other),
                    fix="give that wheel its own stack, or make the patch fit both")


def repack_wheel(project: Project, wheel: Path, replacements: Mapping[str, bytes],
                 out_dir: Path, *, source_date_epoch: str) -> Path:
    """``wheel`` with ``replacements`` (member -> bytes), repacked at the local version."""
    wheel_cli = [sys.executable, "-m", "wheel"]
    env = {"SOURCE_DATE_EPOCH": source_date_epoch}
    with tempfile.TemporaryDirectory(prefix=f"sm120fork-repack-{project.key}-") as tmp:
        unpacked = Path(tmp) / "unpacked"
        packed = Path(tmp) / "packed"
        packed.mkdir()
        try:
            run([*wheel_cli, "unpack", "--dest", str(unpacked), str(wheel)], env=env)
            (root,) = list(unpacked.iterdir())
            for member, data in replacements.items():
                target = root / member
                adds = member.endswith(".py") and target.parent.is_dir() \
                    and not target.exists()  # a module the series adds to a package
                if not target.is_file() and not adds:
                    raise BuildError(f"{member} is not in {wheel.name}",
                                     where=f"project {project.key}")
                target.write_bytes(data)
            run([*wheel_cli, "pack", "--dest-dir", str(packed),
                 "--local-version", project.local_label, str(root)], env=env)
        except CommandError as exc:
            raise BuildError(f"repacking {wheel.name} failed", where=f"project {project.key}",
                             detail=exc.detail, fix="read the wheel tool's output above"
                             ) from exc
        (result,) = list(packed.glob("*.whl"))
        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / result.name
        result.replace(final)
    return final


def check_wheel(wheel: Path, project: Project, series: Series,
                repo: Git) -> list[FingerprintResult]:
    results: list[FingerprintResult] = []
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        for patch in series.patches:
            upstream = match_upstream(repo, patch).fingerprints
            for fp, in_upstream in zip(patch.fingerprints, upstream, strict=True):
                # the members that ship the upstream file: itself, or under a folder
                rel = project.package_path(fp.path)
                members = ([] if rel is None else [rel] if rel in names
                           else [n for n in names if n.endswith("/" + rel)])
                in_wheel = bool(members) and all(fingerprint_in(
                    fp, zf.read(m).decode("utf-8", errors="replace")) for m in members)
                results.append(FingerprintResult(
                    patch=patch.name, path=fp.path, text=fp.text, in_wheel=in_wheel,
                    member=", ".join(members) or "(not in wheel)", in_upstream=in_upstream))
    return results


def require_passed(results: list[FingerprintResult], project: Project) -> None:
    if not (failed := [r for r in results if not r.passed]):
        return
    lines = [f"{r.patch}: {r.path}: {r.text!r}: " + (
        "already present in unpatched upstream" if r.in_upstream
        else f"missing from the wheel ({r.member})") for r in failed]
    raise ArtifactCheckError(
        f"{len(failed)} fingerprint(s) failed: " + "; ".join(lines),
        where=f"project {project.key}",
        fix="a patch that never reaches the wheel, or whose fingerprint upstream already has, "
            "needs a better fingerprint or a fix")


def build_test_variant(today: ResolvedStack, *, project_key: str = "flashinfer",
                       name: str = "test", force: bool = False) -> Path:
    """Build ``project_key`` with its series and its test series; return the wheel."""
    if not re.fullmatch(r"[a-z0-9]+", name):
        raise ConfigError(f"bad test variant name {name!r}", fix="lower-case letters and digits")
    ws, stack, project = today.ws, today.stack, today.stack.project(project_key)
    real = today.series[project_key].patches
    series_dir = ws.series_dir(project)
    tests = load_series(series_dir.with_name(series_dir.name + "-test")).patches
    tree = prepare_tree(ws, stack, project, patches=[*real, *tests], variant=name, force=force)
    variant = dataclasses.replace(project, local_label=f"{project.local_label}.{name}")
    out = ws.state_dir / "test-variants" / stack.name / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log.info("building test variant %s of %s (%d + %d patches)", name, project_key, len(real),
             len(tests))
    return build_wheel(variant, tree.repo, out,
                       changed_files=[f for p in [*real, *tests] for f in p.files])
