"""A new pin for ``bump``: the package-index lookup, the sdist's own commit record,
and the edits to ``forks/<stack>.toml`` (comments and layout kept)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import tarfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import tomlkit
from packaging.version import Version

from sm120fork.declare import GitPin, Project, SdistPin, Stack, WheelPin
from sm120fork.errors import (
    ConfigError,
    MaintenanceError,
)
from sm120fork.fetch.index import find_sdist, find_wheels
from sm120fork.maintain.state import (
    BumpState,
)
from sm120fork.workspace import Workspace

_COMMIT_IN_SOURCE = re.compile(
    r"""(?:__git_commit__|git_commit|__git_version__|git_version|__commit__)\s*[:=]\s*"""
    r"""["']([0-9a-f]{40})["']""")


def index_sdist(project: Project, version: Version) -> tuple[str, str, str]:
    """(filename, sha256, url) of the ``version`` sdist on the package index (PEP 691)."""
    found = find_sdist(project, version)
    return found.filename, found.sha256, found.url


def index_wheels(project: Project, version: Version) -> list[dict[str, str]]:
    """The published wheels of ``version`` as ``[[projects.<key>.wheels]]`` pins."""
    return [{"filename": f.filename, "sha256": f.sha256, "url": ""}
            for f in find_wheels(project, version)]


def commit_from_sdist(sdist: Path) -> str:
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


TomlValues = dict[str, str | bool | None]


def edit_toml(text: str, tables: dict[str, TomlValues], where: str = "") -> str:
    """Set (or with None remove) keys of dotted ``tables``; comments and layout are kept.

    tomlkit edits the document in place, so a re-pin changes only the lines it must.
    """
    doc = tomlkit.parse(text)
    for dotted, values in tables.items():
        node: Any = doc
        for part in dotted.split("."):
            if not isinstance(node, MutableMapping) or part not in node:
                raise ConfigError(f"no [{dotted}] table", where=where)
            node = node[part]
        for key, value in values.items():
            if value is None:
                node.pop(key, None)
            else:
                node[key] = value
    return tomlkit.dumps(doc)


def set_toml_values(text: str, table: str, values: TomlValues, where: str = "") -> str:
    """:func:`edit_toml` for one table."""
    return edit_toml(text, {table: values}, where)


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


def create_stack(ws: Workspace, source: Stack, project: Project, name: str) -> Stack:
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
    description = f"{project.distribution} fork, bumped from stack {source.name}"
    text = (f"# Copied from forks/{source.path.name} by `bump --new-stack {name}` to follow\n"
            f"# {project.distribution} past the release that stack pins; not the default.\n\n"
            f"[stack]\nname = {tomlkit.string(name).as_string()}\ndefault = false\n"
            f"description = {tomlkit.string(description).as_string()}\n\n"
            f"{tables}\n")
    text = set_toml_values(text, f"projects.{project.key}", {"series": series_rel},
                           where=str(target))
    shutil.copytree(ws.series_dir(project), ws.root / series_rel)
    target.write_text(text, encoding="utf-8")
    return ws.stack(name)


def pinned_project(project: Project, state: BumpState) -> Project:
    pin = state.new_pin
    wheels = (tuple(WheelPin(**w) for w in pin["wheels"]) if "wheels" in pin else
              project.wheels)
    return dataclasses.replace(
        project, version=state.new_version, source=pin["source"],
        git=GitPin(**pin["git"]), sdist=SdistPin(**pin["sdist"]), wheels=wheels)


def declaration_with_pin(text: str, project: Project, state: BumpState, where: str) -> str:
    pin = state.new_pin
    key = project.key
    git, sd = pin["git"], pin["sdist"]
    text = edit_toml(text, {
        f"projects.{key}": {"version": state.new_version, "source": pin["source"]},
        f"projects.{key}.git": {
            "url": git["url"], "tag": git["tag"], "commit": git["commit"],
            "commit_verified": bool(git["commit_verified"]), "note": git["note"] or None},
        f"projects.{key}.sdist": {
            "filename": sd["filename"], "sha256": sd["sha256"], "url": sd["url"] or None},
    }, where)
    if "wheels" not in pin:
        return text
    # The published wheels of the new version (an empty series ships them as published),
    # or none: pins of the old version's wheels would name the wrong version.
    doc = tomlkit.parse(text)
    table = doc["projects"][key]
    assert isinstance(table, MutableMapping)
    table.pop("wheels", None)
    if pin["wheels"]:
        wheels = tomlkit.aot()
        for w in pin["wheels"]:
            entry = tomlkit.table()
            entry["filename"] = w["filename"]
            entry["sha256"] = w["sha256"]
            if w.get("url"):
                entry["url"] = w["url"]
            wheels.append(entry)
        table["wheels"] = wheels
    return tomlkit.dumps(doc)


def remove_created_stack(ws: Workspace, state: BumpState) -> None:
    Path(state.declaration).unlink(missing_ok=True)
    series = Path(state.series_dir)
    shutil.rmtree(series, ignore_errors=True)
    parent = series.parent
    if parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()

