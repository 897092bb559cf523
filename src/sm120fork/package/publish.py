"""The release step: a stack's checked wheels, ``constraints.txt``, ``manifest.json`` and
the plugin's ``plugin/`` staged and swapped into ``wheels/<stack>/`` at once, only after
every project built and passed, so a reader never sees two builds mixed; and the pip lines
that install it, one per route: from the stack's folder or from the index of our wheels.
From the index each line pins the exact version: a bare public version there would let pip
take the public release for ours.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from sm120fork import __version__
from sm120fork import manifest as manifest_file
from sm120fork.declare import Stack
from sm120fork.errors import BuildError
from sm120fork.manifest import Manifest, ManifestEntry
from sm120fork.plugin.build import PLUGIN_DIR, PublishedPlugin
from sm120fork.util.files import (
    atomic_copy,
    remove_stale_scratch,
    sha256_file,
    staged_dir,
)
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")
CONSTRAINTS = "constraints.txt"
PATCHED = "patched wheels"
WITH_AOT = "patched wheels + AOT wheel (prebuilt kernels, no nvcc)"
PLUGIN = "stock SGLang + plugin"


class Route(NamedTuple):
    name: str
    line: str


def folder_routes(where: str, entries: Sequence[ManifestEntry],
                  plugin: PublishedPlugin | None = None) -> list[Route]:
    """The routes from the stack's folder ``where`` (as the user types it).

    A stack that ships one wheel per platform (sglang 0.5.23: cp311/cp312, x86_64/aarch64)
    cannot be installed as ``*.whl`` (pip refuses the other platforms' wheels), so pip then
    picks the right one from the folder by the pinned versions in constraints.txt.
    """
    names = sorted({e.distribution for e in entries})
    if len(names) == len(entries):
        line = f"pip install -c {where}/{CONSTRAINTS} {where}/*.whl"
    else:
        line = f"pip install -c {where}/{CONSTRAINTS} --find-links {where} {' '.join(names)}"
    routes = [Route(name=PATCHED, line=line)]
    if plugin is not None:
        routes.append(Route(name=PLUGIN, line=f"pip install sglang=={plugin.sglang} "
                                              f"{where}/{PLUGIN_DIR}/{plugin.wheel}"))
    return routes


def index_routes(url: str, entries: Sequence[ManifestEntry], *,
                 plugin: PublishedPlugin | None = None, aot: str | None = None) -> list[Route]:
    """The routes from the index at ``url`` (``url``/simple/, its files under ``url``/files/),
    ``aot`` the AOT wheel's pin (``distribution==version``) where the stack has one.

    The plugin route names the plugin wheel's own URL with its sha256, not the index:
    there ``sglang==0.5.23`` would match our patched 0.5.23+sm120.1 too (a local version
    satisfies ``==`` without one), and pip prefers it, so the route would not be stock SGLang.
    """
    base = f"pip install --extra-index-url {url}simple/ "
    # one pin per distribution: a project may ship one wheel per Python and platform
    pins = " ".join(dict.fromkeys(f"{e.distribution}=={e.version}" for e in entries))
    routes = [Route(name=PATCHED, line=base + pins)]
    if aot is not None:
        routes.append(Route(name=WITH_AOT, line=f"{base}{pins} {aot}"))
    if plugin is not None:
        routes.append(Route(name=PLUGIN, line=(
            f"pip install sglang=={plugin.sglang} "
            f"{url}{file_path(plugin.wheel)}#sha256={plugin.sha256}")))
    return routes


def file_path(filename: str) -> str:
    """Where the index keeps a file, relative to its root (``files/<name>``, URL-quoted)."""
    return f"files/{quote(filename)}"


@dataclass(frozen=True, kw_only=True)
class ProjectBuild:
    project: str
    distribution: str
    upstream_version: str
    version: str
    wheel: Path
    sha256: str
    cached: bool
    seconds: float
    entry: ManifestEntry


def shown(ws: Workspace, path: Path) -> str:
    """``path`` as a user types it: relative to the checkout when inside it."""
    try:
        return path.resolve().relative_to(ws.root.resolve()).as_posix()
    except ValueError:
        return str(path)


def install_command(ws: Workspace, out: Path, builds: list[ProjectBuild] | None = None) -> str:
    """The pip line that installs exactly this build (its patched wheels' route)."""
    return folder_routes(shown(ws, out), [b.entry for b in builds or []])[0].line


#: What a published folder holds besides the wheels: a path relative to the folder ->
#: the file to copy (a Path) or the text to write (a str).
Files = Mapping[str, Path | str]


def _wanted(ws: Workspace, stack: Stack, builds: list[ProjectBuild], out: Path,
            extra: Files) -> dict[str, Path | str]:
    """Each file the folder will hold: the wheels, constraints, manifest and ``extra``."""
    # One line per distribution: a project may ship one wheel per Python and platform.
    constraints = "".join(dict.fromkeys(f"{b.distribution}=={b.version}\n" for b in builds))
    manifest = Manifest(toolkit_version=__version__, stack=stack.name,
                        wheels=tuple(b.entry for b in builds))
    wanted: dict[str, Path | str] = {b.wheel.name: b.wheel for b in builds}
    for name, content in [
            (CONSTRAINTS, f"# {stack.name}: {install_command(ws, out, builds)}\n" + constraints),
            (manifest_file.FILE, json.dumps(manifest.to_json(), indent=2) + "\n"),
            *extra.items()]:
        if name in wanted:
            raise BuildError(f"two files of one build would be published as {name}",
                             where="publish", fix="report this as a toolkit bug")
        wanted[name] = content
    return wanted


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}


def _unchanged(out: Path, wanted: dict[str, Path | str]) -> bool:
    return out.is_dir() and _files(out) == set(wanted) and all(
        sha256_file(out / name) == sha256_file(content) if isinstance(content, Path)
        else (out / name).read_text(encoding="utf-8") == content
        for name, content in wanted.items())


def publish(ws: Workspace, stack: Stack, builds: list[ProjectBuild],
            out: Path | None = None, *, extra: Files | None = None) -> Path:
    """Replace ``wheels/<stack>/`` (or ``out``) by these wheels, constraints, manifest and
    ``extra`` files, staged together and swapped once.  Call with the workspace lock held:
    staging folders of killed runs are removed here."""
    out = out or ws.stack_wheels(stack.name)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for leftover in remove_stale_scratch(out.parent):  # staging folders of killed runs
            log.info("removed %s, left by a killed run", leftover)
        wanted = _wanted(ws, stack, builds, out, extra or {})
        if _unchanged(out, wanted):
            return out
        # What a publish did not write (a file it writes, or a wheel beside those): kept
        folders = {n.rpartition("/")[0] for n in wanted}
        foreign = sorted(n for n in (_files(out) if out.is_dir() else ()) if n not in wanted
                         and not (n.endswith(".whl") and n.rpartition("/")[0] in folders))
        if foreign:
            raise BuildError(f"it holds files a build did not publish ({', '.join(foreign[:5])}"
                             "); publishing replaces the whole folder",
                             where=str(out), fix="choose a new or empty folder for --out")
        with staged_dir(out) as staged:
            staged.mkdir()
            os.chmod(staged, 0o755)
            for name, content in wanted.items():
                dest = staged / name
                if not dest.parent.is_dir():
                    dest.parent.mkdir(parents=True)
                    os.chmod(dest.parent, 0o755)
                if isinstance(content, Path):
                    atomic_copy(content, dest)
                else:
                    dest.write_text(content, encoding="utf-8")
                    os.chmod(dest, 0o644)
        return out
    except OSError as exc:
        if exc.errno not in _NOT_WRITABLE:
            raise
        target = Path(exc.filename) if exc.filename else out.parent
        folder = target if target.is_dir() else target.parent
        raise unwritable(folder, exc.strerror or "not writable", stack) from exc


#: A folder the wheels cannot be written into: permissions, a read-only file system.
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def unwritable(folder: Path, why: str, stack: Stack) -> BuildError:
    """The one-line error for a folder the wheels cannot be published into."""
    return BuildError(
        f"cannot publish the wheels here: {why.lower()}", where=str(folder),
        fix=f"make it writable (chmod u+w {shlex.quote(str(folder))}) or publish elsewhere: "
            f"{command('build', '--stack', stack.name, '--out', 'DIR')}")


def check_writable(out: Path, stack: Stack) -> None:
    """Refuse, before anything is built, a folder the wheels could not be published into
    (the new folder is staged beside ``out`` and swapped in: ``out``'s parent, or the
    nearest folder above it that exists, must be writable)."""
    folder = next((p for p in (out.parent, *out.parent.parents) if p.is_dir()), out.parent)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise unwritable(folder, os.strerror(errno.EACCES), stack)
