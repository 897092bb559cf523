"""The ``wheel`` source kind: the first declared wheel's sources (no ``.dist-info``, no
compiled files, as upstream's repository) become the fork tree under the package root."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path, PurePosixPath

from sm120fork.declare import Project
from sm120fork.errors import SourceError
from sm120fork.fetch.archive import check_member
from sm120fork.fetch.source import make_upstream_tree

#: Suffixes of compiled files: never part of the tree, never changed by a series.
COMPILED_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".o", ".a", ".cubin", ".fatbin")


def is_compiled(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.endswith(COMPILED_SUFFIXES) or ".so." in name


def is_metadata(member: str) -> bool:
    """A wheel's own metadata (``*.dist-info/``, ``*.data/``): not upstream source."""
    top = member.split("/", 1)[0]
    return top.endswith((".dist-info", ".data"))


def source_members(wheel: Path) -> list[str]:
    """The wheel's files that the upstream repository holds too (relative to the package)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
    for name in names:
        check_member(name, wheel)
    return [n for n in names if not is_metadata(n) and not is_compiled(n)]


def init_from_wheel(project: Project, wheel: Path, work: Path) -> str:
    """Create ``work`` as a git repo whose first commit is the wheel's sources."""
    members = source_members(wheel)
    if not members:
        raise SourceError("the wheel holds no source files", where=str(wheel))

    def fill(_scratch: Path, dest: Path) -> None:
        with zipfile.ZipFile(wheel) as zf:
            for name in members:
                info = zf.getinfo(name)
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
                mode = (info.external_attr >> 16) & 0o777
                if mode & 0o111:
                    target.chmod(0o755)

    pin = project.wheels[0]
    return make_upstream_tree(
        project, work, fill,
        f"Upstream {project.distribution} {project.version}\n\n"
        f"wheel {pin.filename} sha256 {pin.sha256} (compiled files left out)\n")
