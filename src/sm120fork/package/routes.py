"""The pip lines that install a stack's build, one per route: from the stack's folder or
from the index of our wheels.  From the index each line pins the exact version: a bare
public version there would let pip take the public release for ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from sm120fork.manifest import ManifestEntry
from sm120fork.plugin.build import PLUGIN_DIR, PublishedPlugin

CONSTRAINTS = "constraints.txt"
PATCHED = "patched wheels"
WITH_AOT = "patched wheels + AOT wheel (prebuilt kernels, no nvcc)"
PLUGIN = "stock SGLang + plugin"


@dataclass(frozen=True, kw_only=True)
class Route:
    name: str
    line: str


@dataclass(frozen=True, kw_only=True)
class Pin:
    """One distribution at one version (a wheel the route installs, or needs beside it)."""

    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.distribution}=={self.version}"


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
                 plugin: PublishedPlugin | None = None, aot: Pin | None = None) -> list[Route]:
    """The routes from the index at ``url`` (``url``/simple/, its files under ``url``/files/).

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
