"""``--stack NAME``: the variants of a GPU run from a stack, with no hand download.

``patched`` is the FlashInfer wheel of ``wheels/<stack>/``; ``unpatched`` is upstream's,
built unchanged from the stack's pinned sdist (cached by its sha256).  A project shipped
as published has no A/B: its wheel is upstream.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import parse_wheel_filename

from sm120fork import manifest as manifest_file
from sm120fork.errors import ConfigError
from sm120fork.gpu.core.documents import MadeFrom, Provenance
from sm120fork.manifest import Manifest, ManifestEntry
from sm120fork.record import Tested
from sm120fork.resolved import ResolvedStack
from sm120fork.util.files import made_once, sha256_file
from sm120fork.util.hint import command
from sm120fork.util.pypa import pypa_build

log = logging.getLogger("sm120fork")

PROJECT = "flashinfer"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackWheels:
    """What ``--stack`` resolved to: {variant: wheel}, and why no baseline."""

    wheels: Mapping[str, Path]
    note: str | None = None
    tested: Tested | None = None


def upstream_wheel(stack: ResolvedStack) -> Path:
    """Upstream FlashInfer of the stack's pin, built unchanged from its pinned sdist."""
    from sm120fork.fetch.archive import safe_extract
    from sm120fork.fetch.index import download_pinned

    ws, project = stack.ws, stack.stack.project(PROJECT)

    def build(dist: Path) -> None:
        sdist = download_pinned(project, project.sdist_pin, ws.sdist_cache)  # sha256-checked
        log.info("building upstream %s %s from its pinned sdist (unchanged)",
                 project.distribution, project.version)
        with tempfile.TemporaryDirectory(prefix="sm120fork-upstream-") as tmp:
            pypa_build(safe_extract(sdist, Path(tmp) / "src"), dist, env={},
                       name=f"upstream {project.distribution}",
                       where=f"upstream {project.distribution} {project.version}")

    # Keyed by the pin's sha256, so a box that carries the cache needs no sdist or index.
    pin = project.sdist_pin.sha256
    dist = made_once(ws.state_dir / "cache" / "upstream-wheels" / pin[:16], pin, build)
    return next(dist.glob("*.whl"))


def resolve(stack: ResolvedStack, *, baseline: bool) -> StackWheels:
    """The variants of ``stack``: patched, and (``baseline``) upstream for the A/B."""
    entry = stack.build().first(PROJECT)
    if entry is None:
        raise ConfigError(f"the build of {stack.name} has no {PROJECT} wheel",
                          where=str(stack.manifest_path))
    wheel = stack.folder / entry.wheel
    if not wheel.is_file():
        raise ConfigError(f"{wheel.name} is listed in the manifest but missing",
                          where=str(stack.folder), fix=command("build", "--stack", stack.name))
    wheels = {"patched": wheel}
    note = None
    if entry.used_as_published:
        note = (f"{stack.name} ships upstream's {wheel.name} as published (empty series): "
                "no A/B, the one variant is upstream")
    elif baseline:
        wheels["unpatched"] = upstream_wheel(stack)
    return StackWheels(wheels=wheels, note=note, tested=stack.tested())


def installable(manifest: Manifest, tags: set[Tag]) -> dict[str, ManifestEntry]:
    """{project: its first wheel in ``manifest`` that installs where ``tags`` hold}."""
    chosen: dict[str, ManifestEntry] = {}
    for w in manifest.wheels:
        if (w.project not in chosen and w.wheel.endswith(".whl")
                and parse_wheel_filename(w.wheel)[3] & tags):
            chosen[w.project] = w
    return chosen


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerTrees:
    """The stack's wheels unpacked for ``sglang-layer``, and what its report records."""

    sglang_path: Path
    site: tuple[Path, ...]
    made: Provenance


def _unpack(wheel: Path, dest: Path, sha256: str) -> Path:
    def unpack(new: Path) -> None:
        if sha256_file(wheel) != sha256:
            raise ConfigError(f"{wheel.name} is not the wheel its manifest lists (sha256)",
                              where=str(wheel.parent), fix="build the stack again")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(new)

    return made_once(dest, sha256, unpack)


def layer_trees(folder: Path, work_dir: Path) -> LayerTrees:
    """The SGLang and FlashInfer wheels of a stack's build (wheels/<stack>/, or a kit's
    stack/) for this interpreter, unpacked under ``work_dir``."""
    path = folder / manifest_file.FILE  # none there: no build, refused naming it
    manifest = manifest_file.read(path, fix=command("build", "--stack", folder.name))
    stack = manifest.stack
    chosen = {p: w for p, w in installable(manifest, set(sys_tags())).items()
              if p in ("sglang", PROJECT)}
    if "sglang" not in chosen:
        raise ConfigError(f"stack {stack} has no sglang wheel for this Python and platform",
                          where=str(path), fix="run on a Python the stack builds for")
    trees = {project: _unpack(folder / w.wheel, work_dir / "layer-trees" / stack / project,
                              w.sha256)
             for project, w in chosen.items()}
    made: Provenance = {"stack": stack, "made_from": [
        {"project": p, "series": w.series, "series_digest": w.series_digest,
         "wheel": w.wheel, "wheel_sha256": w.sha256} for p, w in chosen.items()]}
    return LayerTrees(sglang_path=trees["sglang"],
                      site=tuple(t for p, t in trees.items() if p != "sglang"), made=made)


def plugin_trees(stock_wheel: Path, plugin_wheel: Path, work_dir: Path,
                 stack: str) -> tuple[Path, Path, list[MadeFrom]]:
    """Stock SGLang and the plugin unpacked under ``work_dir`` for the plugin route: (the
    stock tree, the plugin's site, the record's ``made_from`` rows)."""
    rows: list[MadeFrom] = []
    trees: list[Path] = []
    for wheel, project, variant, name in (
            (stock_wheel, "sglang", "upstream", "stock-sglang"),
            (plugin_wheel, "sglang@plugin", "plugin", "plugin")):
        if not wheel.is_file():
            raise ConfigError(f"no wheel {wheel}", where=f"sglang-layer --{name}-wheel",
                              fix="give the file (the kit's, or wheels/<stack>/plugin/)")
        sha = sha256_file(wheel)
        trees.append(_unpack(wheel, work_dir / "layer-trees" / stack / name, sha))
        rows.append({"project": project, "variant": variant, "wheel": wheel.name,
                     "wheel_sha256": sha})
    return trees[0], trees[1], rows


def plugin_wheel(folder: Path) -> Path | None:
    """The stack's plugin wheel (``wheels/<stack>/plugin/``), if its build makes one."""
    found = sorted((folder / "plugin").glob("*.whl"))
    if len(found) > 1:
        raise ConfigError(f"more than one plugin wheel: {[w.name for w in found]}",
                          where=str(folder / "plugin"),
                          fix=command("build", "--stack", folder.name))
    return found[0] if found else None


def plugin_route_wheels(folder: Path, plugin: Path | None = None,
                        stock: Path | None = None) -> tuple[Path, Path]:
    """The plugin route's wheels: ``folder``'s ``plugin/`` wheel, and stock SGLang as the
    kit beside it names it; given ones win."""
    plugin = plugin or plugin_wheel(folder)
    if plugin is None:
        raise ConfigError("expected one plugin wheel, found 0", where=str(folder / "plugin"),
                          fix=f"build a stack with a plugin "
                          f"({command('build', '--stack', 'NAME')}), or pass --plugin-wheel")
    if stock is None:
        kit_json = folder.parent / "kit.json"
        route = (json.loads(kit_json.read_text(encoding="utf-8")).get("plugin_route") or {}
                 if kit_json.is_file() else {})
        if not route.get("sglang"):
            raise ConfigError("no stock SGLang wheel for the plugin route",
                              where=str(kit_json),
                              fix="pass --stock-wheel (the published wheel of the pin), or "
                              "run from a kit made with --harness sglang_layer")
        stock = folder.parent / str(route["sglang"])
    return plugin, stock
