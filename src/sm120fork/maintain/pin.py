"""A new pin for ``bump``: the package-index lookup, the sdist's own commit record,
and the edits to ``forks/<stack>.toml`` (comments and layout kept)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import tomllib
from collections.abc import MutableMapping
from pathlib import Path

import tomlkit
from packaging.version import Version
from tomlkit.items import Table

from sm120fork.declare import GitPin, Project, SdistPin, Stack, WheelPin, load_stack
from sm120fork.errors import ConfigError, MaintenanceError
from sm120fork.fetch.index import project_page
from sm120fork.fetch.kinds import source_kind
from sm120fork.maintain.state import BumpState, NewPin
from sm120fork.patch.refresh import note_written
from sm120fork.workspace import Workspace


def check_released(project: Project, version: Version, where: str) -> None:
    """Refuse a version the index lists no file of, naming the newest release."""
    page = project_page(project)
    versions = page.releases(project)
    if version in versions or version in page.sdists(project, include_yanked=True):
        return  # (yanked: the sdist lookup says so)
    final = [v for v in versions if not v.is_prerelease] or versions
    raise MaintenanceError(
        f"{project.distribution} {version} does not exist on the package index; newest: "
        f"{final[-1] if final else 'none'}", where=where)


def closure(stack: Stack, project: Project) -> list[Project]:
    """``project`` and the projects it requires, directly or not, in the stack's order."""
    wanted = {project.key}
    todo = [project]
    while todo:
        for key in todo.pop().requires:
            if key not in wanted:
                wanted.add(key)
                todo.append(stack.project(key))
    return [p for p in stack.projects if p.key in wanted]


def create_stack_check(ws: Workspace, name: str) -> None:
    """Refuse a ``--new-stack`` name that is taken, before anything is written."""
    target = ws.forks_dir / f"{name}.toml"
    if target.exists():
        raise MaintenanceError(f"stack {name!r} already exists", where=str(target),
                               fix="bump it directly, or choose another --new-stack name")
    series_root = ws.root / "patches" / name
    if series_root.exists():
        raise MaintenanceError("series directory already exists",
                               where=series_root.relative_to(ws.root).as_posix(),
                               fix="remove it, or choose another --new-stack name")


def create_stack(ws: Workspace, source: Stack, project: Project, name: str) -> Stack:
    """A stack ``name`` copied from ``source``: ``project`` and the projects it requires,
    written from the data (the source's comments describe other releases)."""
    target = ws.forks_dir / f"{name}.toml"
    series_root = ws.root / "patches" / name
    copied = closure(source, project)
    data = tomllib.loads(source.path.read_text(encoding="utf-8"))["projects"]
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"Made by `bump --new-stack {name}` from stack {source.name}: "
                            f"{project.distribution} and the releases it pins."))
    doc.add(tomlkit.nl())
    doc["stack"] = {"name": name, "default": False,
                    "description": f"{project.distribution} fork (bump in progress)"}
    doc["projects"] = {p.key: {**data[p.key], "series": f"patches/{name}/{p.key}"}
                       for p in copied}
    for p in copied:
        shutil.copytree(ws.series_dir(p), series_root / p.key)
        note_written(ws, (f for f in (series_root / p.key).rglob("*") if f.is_file()))
    target.write_text(tomlkit.dumps(doc), encoding="utf-8")
    return load_stack(target, strict=False)


def check_declaration(path: Path, text: str, *, fix: str, pins: bool = True) -> Stack:
    """The stack ``text`` declares, refused unless it loads (with ``pins``: agrees)."""
    try:
        return load_stack(path, text, strict=pins)
    except ConfigError as exc:
        raise MaintenanceError(
            f"the new pins would not load: {exc.what}",
            where=str(path) + (f" ({exc.where.rpartition(': ')[2]})" if exc.where else ""),
            fix=f"nothing was written; `{fix}` restores the rest") from None


def _fill(table: Table, pin: GitPin | SdistPin | WheelPin) -> Table:
    """``pin``'s fields written into ``table`` (an empty ``url`` or ``note`` left out)."""
    for field in dataclasses.fields(pin):
        value = getattr(pin, field.name)
        if value == "" and field.name in ("note", "url"):
            table.pop(field.name, None)
        else:
            table[field.name] = value
    return table


def _set_pin(table: Table, pin: NewPin) -> None:
    """Write one project's pin into its table."""
    table["source"] = pin.source
    for name, value in (("git", pin.git), ("sdist", pin.sdist)):
        if value is None:
            table.pop(name, None)
            continue
        if not isinstance(table.get(name), MutableMapping):
            table[name] = tomlkit.table()
        _fill(table[name], value)
    if pin.wheels is not None:
        table.pop("wheels", None)
    if pin.wheels:
        aot = tomlkit.aot()
        for w in pin.wheels:
            aot.append(_fill(tomlkit.table(), w))
        aot[-1].add(tomlkit.nl())  # a blank line before the table that follows
        table["wheels"] = aot
    if source_kind(pin.source).ships_wheels:
        # Repacked, not built: a version stamp has nothing left to stamp.
        table.pop("version_stamp", None)


def declaration_with_pin(text: str, project: Project, state: BumpState, where: str, *,
                         description: str = "") -> str:
    """``text`` with the bump's pins written (the project's and those it moves), its
    comments kept."""
    pin = state.new_pin
    doc = tomlkit.parse(text)
    projects = doc.get("projects")
    for key, new in {project.key: dataclasses.replace(pin, version=state.new_version),
                     **pin.companions}.items():
        if not isinstance(projects, MutableMapping) or key not in projects:
            raise ConfigError(f"no [projects.{key}] table", where=where)
        projects[key]["version"] = new.version
        _set_pin(projects[key], new)
    table = doc["projects"][project.key]
    if pin.upstream_requires is not None and (
            pin.upstream_requires or "upstream_requires" in table):
        table["upstream_requires"] = list(pin.upstream_requires)
    if pin.layout and table.get("layout") != pin.layout:
        table["layout"] = pin.layout
    if description:
        doc["stack"]["description"] = description
    # The tables a pin edit removes (git, sdist, version_stamp) leave their blank lines.
    return re.sub(r"\n{3,}", "\n\n", tomlkit.dumps(doc)).rstrip("\n") + "\n"
