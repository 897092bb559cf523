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
        if stripped.startswith("["):  # a table or an array of tables ([[...wheels]])
            header = stripped.lstrip("[").split("]", 1)[0].strip()
            inside = header == f"projects.{key}" or header.startswith(f"projects.{key}.")
        if inside:
            out.append(line)
    while out and (not out[-1].strip() or out[-1].lstrip().startswith("#")):
        out.pop()
    return "".join(out)


def _closure(stack: Stack, project: Project) -> list[Project]:
    """``project`` and the projects it requires, directly or not, in the stack's order."""
    wanted = {project.key}
    todo = [project]
    while todo:
        for key in todo.pop().requires:
            if key not in wanted:
                wanted.add(key)
                todo.append(stack.project(key))
    return [p for p in stack.projects if p.key in wanted]


def create_stack(ws: Workspace, source: Stack, project: Project, name: str) -> Stack:
    """A stack ``name`` copied from ``source``: ``project`` and the projects it requires
    (their declarations, layout key included, and series), as ``source`` pins them."""
    target = ws.forks_dir / f"{name}.toml"
    if target.exists():
        raise MaintenanceError(f"stack {name!r} already exists", where=str(target),
                               fix="bump it directly, or choose another --new-stack name")
    series_root = ws.root / "patches" / name
    if series_root.exists():
        raise MaintenanceError("series directory already exists",
                               where=series_root.relative_to(ws.root).as_posix(),
                               fix="remove it, or choose another --new-stack name")
    copied = _closure(source, project)
    source_text = source.path.read_text(encoding="utf-8")
    tables = "\n".join(_project_tables(source_text, p.key) for p in copied)
    others = [p.key for p in copied if p.key != project.key]
    description = (f"{project.distribution} fork, bumped from stack {source.name}"
                   + (f" (with its {', '.join(others)} as that stack pins "
                      f"{'it' if len(others) == 1 else 'them'})"
                      if others else ""))
    text = (f"# Copied from forks/{source.path.name} by `bump --new-stack {name}` to follow\n"
            f"# {project.distribution} past the release that stack pins; not the default.\n\n"
            f"[stack]\nname = {tomlkit.string(name).as_string()}\ndefault = false\n"
            f"description = {tomlkit.string(description).as_string()}\n\n"
            f"{tables}\n")
    text = edit_toml(text, {f"projects.{p.key}": {"series": f"patches/{name}/{p.key}"}
                            for p in copied}, where=str(target))
    for p in copied:
        shutil.copytree(ws.series_dir(p), series_root / p.key)
    target.write_text(text, encoding="utf-8")
    return ws.stack(name)


def pinned_project(project: Project, state: BumpState) -> Project:
    """``project`` at the new pin; a ``wheel`` source's pin may have no git or sdist."""
    pin = state.new_pin
    wheels = (tuple(WheelPin(**w) for w in pin["wheels"]) if "wheels" in pin else
              project.wheels)
    return dataclasses.replace(
        project, version=state.new_version, source=pin["source"],
        git=GitPin(**pin["git"]) if pin.get("git") else None,
        sdist=SdistPin(**pin["sdist"]) if pin.get("sdist") else None, wheels=wheels)


def declaration_with_pin(text: str, project: Project, state: BumpState, where: str) -> str:
    pin = state.new_pin
    key = project.key
    git, sd = pin.get("git"), pin.get("sdist")
    tables: dict[str, TomlValues] = {
        f"projects.{key}": {"version": state.new_version, "source": pin["source"]}}
    if git:
        tables[f"projects.{key}.git"] = {
            "url": git["url"], "tag": git["tag"], "commit": git["commit"],
            "commit_verified": bool(git["commit_verified"]), "note": git["note"] or None}
    if sd:
        tables[f"projects.{key}.sdist"] = {
            "filename": sd["filename"], "sha256": sd["sha256"], "url": sd["url"] or None}
    text = edit_toml(text, tables, where)
    # A wheel source pinned without a git or sdist pin: the old version's would be wrong.
    doc = tomlkit.parse(text)
    table = doc["projects"][key]
    assert isinstance(table, MutableMapping)
    for name, value in (("git", git), ("sdist", sd)):
        if not value and name in table:
            table.pop(name)
    text = tomlkit.dumps(doc)
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
    """Undo :func:`create_stack`: its declaration and ``patches/<stack>/`` (every series it
    copied; the folder did not exist before)."""
    Path(state.declaration).unlink(missing_ok=True)
    shutil.rmtree(ws.root / "patches" / state.stack, ignore_errors=True)

