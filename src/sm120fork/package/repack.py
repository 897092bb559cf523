"""Patched wheels from published ones: the ``wheel`` source kind's build step.

Each declared wheel is unpacked (``wheel unpack``), the files the series changed are
replaced by the fork tree's, and ``wheel pack`` repacks it under the local version; every
other file keeps its bytes.  A series may change only non-compiled files the wheel ships
(or add a module to the package), and each wheel must ship the first one's bytes there.
"""

from __future__ import annotations

import logging
import re
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sm120fork.declare import Project
from sm120fork.errors import BuildError, CommandError, PatchError
from sm120fork.fetch.wheel import is_compiled, source_members
from sm120fork.patch.series import Series
from sm120fork.util.proc import run

log = logging.getLogger("sm120fork")

_NEW_FILE = re.compile(r"^diff --git a/(\S+) b/\1\nnew file mode ", re.MULTILINE)


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
