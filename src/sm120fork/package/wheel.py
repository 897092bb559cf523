"""Build a wheel from a patched fork tree with pypa/build, on a ``git archive`` export of
its HEAD (the version stamped there), so a build killed halfway leaves nothing behind."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from email.message import Message
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from sm120fork.declare import Project
from sm120fork.errors import BuildError, CommandError
from sm120fork.util.files import scratch_prefix
from sm120fork.util.git import Git
from sm120fork.util.proc import run

log = logging.getLogger("sm120fork")


def stamp_version(project: Project, package_dir: Path) -> dict[str, str]:
    """Put the local version into the exported tree; return extra build environment."""
    stamp = project.version_stamp
    if stamp.env:
        return {stamp.env: project.local_version}
    target = package_dir / stamp.file
    if not target.is_file():
        raise BuildError(f"version file {stamp.file} does not exist",
                         where=f"project {project.key}", fix="fix version_stamp.file")
    text = target.read_text(encoding="utf-8")
    pattern = re.compile(r"""(["'])""" + re.escape(project.version) + r"""\1""")
    found = pattern.findall(text)
    if len(found) != 1:
        raise BuildError(f"expected the quoted version {project.version!r} once in {stamp.file}, "
                         f"found it {len(found)} times", where=f"project {project.key}")
    target.write_text(pattern.sub(lambda m: f"{m.group(1)}{project.local_version}{m.group(1)}",
                                  text), encoding="utf-8")
    return {}


def write_series_record(project: Project, package_dir: Path,
                        changed_files: Sequence[str]) -> None:
    """Write the files the series changes, sorted, as the Python module the patched code
    reads (the project's ``series_record``), if declared."""
    if not project.series_record:
        return
    target = package_dir / project.series_record
    if not target.parent.is_dir():
        raise BuildError(f"series_record {project.series_record}: its folder does not exist",
                         where=f"project {project.key}", fix="fix series_record")
    lines = "".join(f"    {json.dumps(path)},\n" for path in sorted(set(changed_files)))
    target.write_text('"""The files this build\'s patch series changes, upstream repository paths '
                      '(written by sm120fork\'s build)."""\n\nCHANGED_FILES = (\n' + lines
                      + ")\n", encoding="utf-8")


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
        repo("read-tree", "HEAD", quiet=True)
        repo("checkout-index", "--all", "--force", f"--prefix={src}/")
        root = project.package_root.strip("/")
        package_dir = src if root in ("", ".") else src / root
        env = stamp_version(project, package_dir)
        write_series_record(project, package_dir, changed_files)
        # Reproducible archives: wheel/setuptools date zip entries from this.
        env["SOURCE_DATE_EPOCH"] = str(repo.commit_time())
        dist = Path(tmp) / "dist"
        log.info("building %s %s", project.distribution, project.local_version)
        try:
            run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(package_dir)],
                env=env, on_line=on_line)
        except CommandError as exc:
            raise BuildError(f"building the {project.distribution} wheel failed",
                             where=f"project {project.key}", detail=exc.detail,
                             fix="read the build output above") from exc
        wheels = sorted(dist.glob("*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"expected one wheel, got {[w.name for w in wheels]}",
                             where=f"project {project.key}")
        wheel = wheels[0]
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
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist()
                         if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return Parser().parsestr(zf.read(meta_name).decode("utf-8"))


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The Requires-Dist entries of a wheel (from its METADATA)."""
    return [Requirement(r) for r in wheel_metadata(wheel).get_all("Requires-Dist") or []]


def wheel_extras(wheel: Path) -> set[str]:
    """The extras a wheel provides (Provides-Extra), normalised."""
    return {canonicalize_name(e) for e in wheel_metadata(wheel).get_all("Provides-Extra") or []}
