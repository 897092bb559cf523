"""Generate the plugin's hooks from a fork tree (upstream tagged ``upstream``, one commit
per patch): per patch, the top-level statements of each Python file it changes, before and
after.  A changed upstream function is a ``replace`` hook; a new function, import, literal
constant or names added to a ``from M import`` a ``provide`` hook; a new module a ``module``
hook; anything else makes the patch (and any patch sharing a unit with it) "wheel only".
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sm120fork.errors import BuildError
from sm120fork.plugin.runtime import (
    Hook,
    ModuleUnits,
    Spec,
    bound_names,
    sha256_text,
    unit_source,
)
from sm120fork.util.git import Git

UPSTREAM_TAG = "upstream"

Key = tuple[str, ...]


def _key(node: ast.stmt, seen: Counter[Key]) -> Key:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return ("def", node.name)
    if isinstance(node, ast.ClassDef):
        return ("class", node.name)
    if isinstance(node, ast.ImportFrom):
        base: Key = ("from", "." * node.level + (node.module or ""))
    elif isinstance(node, ast.Import):
        base = ("import", *sorted(a.name for a in node.names))
    elif isinstance(node, ast.Assign | ast.AnnAssign) and bound_names(node):
        base = ("assign", *bound_names(node))
    else:
        base = ("stmt", ast.dump(node))
    seen[base] += 1
    return (*base, str(seen[base]))


def _units(source: str, where: str) -> dict[Key, ast.stmt]:
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise BuildError(f"cannot parse {where}: {exc}", where=where) from exc
    seen: Counter[Key] = Counter()
    return {_key(node, seen): node for node in tree.body}


def _is_literal(node: ast.stmt) -> bool:
    if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
        return False
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class _Change:
    """One unit a patch changes: ``kind`` replace/provide, or a wheel-only reason."""

    path: str
    key: Key
    kind: str
    names: tuple[str, ...]
    source: str = ""
    wheel_only: str = ""


def _describe(key: Key) -> str:
    kind = key[0]
    if kind in ("def", "class"):
        return f"{'class' if kind == 'class' else 'function'} {key[1]}"
    if kind == "stmt":
        return "a module-level statement"
    return f"{kind} {' '.join(key[1:-1])}".strip()


def _added_from_import(old: ast.ImportFrom, new: ast.ImportFrom) -> str | None:
    """``from M import <added>`` if ``new`` only adds names to ``old`` (else None)."""
    before = {(a.name, a.asname) for a in old.names}
    after = {(a.name, a.asname) for a in new.names}
    if not before <= after or after == before:
        return None
    added = sorted(after - before)
    names = ", ".join(n if a is None else f"{n} as {a}" for n, a in added)
    return f"from {'.' * new.level}{new.module or ''} import {names}\n"


def _method_changes(path: str, key: Key, old: ast.ClassDef, new: ast.ClassDef,
                    sources: tuple[str, str]) -> list[_Change]:
    """A changed class: one ``replace`` per changed method, if nothing else changed and
    each is plain (no decorator, no zero-argument ``super()``, no private ``__name``: those
    need the class body); ``sources``: the file before and after."""
    wheel_only = [_Change(path, key, "", (new.name,), wheel_only=(
        f"changes module-level code in {path} ({_describe(key)} other than inside "
        "plain methods)"))]
    before, after = _members(old), _members(new)
    if _header(old) != _header(new) or before.keys() != after.keys():
        return wheel_only
    changes: list[_Change] = []
    for member, node in after.items():
        text = unit_source(sources[1], node)
        if text == unit_source(sources[0], before[member]):
            continue
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or \
                node.decorator_list or _needs_class_body(node):
            return wheel_only
        dotted = f"{new.name}.{node.name}"
        changes.append(_Change(path, ("def", dotted), "replace", (dotted,), text))
    return changes


def _members(node: ast.ClassDef) -> dict[str, ast.stmt]:
    return {f"{type(n).__name__}:{getattr(n, 'name', i)}": n for i, n in enumerate(node.body)}


def _header(node: ast.ClassDef) -> str:
    return ast.dump(ast.ClassDef(name=node.name, bases=node.bases, keywords=node.keywords,
                                 body=[], decorator_list=node.decorator_list))


def _needs_class_body(node: ast.stmt) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and \
                sub.func.id == "super" and not sub.args:
            return True
        ident = sub.id if isinstance(sub, ast.Name) else \
            sub.attr if isinstance(sub, ast.Attribute) else ""
        if ident.startswith("__") and not ident.endswith("__"):
            return True
    return False


def diff_file(path: str, before: str | None, after: str | None) -> list[_Change]:
    """The unit-level changes of one file (``path`` relative to the package root)."""
    if not path.endswith(".py"):
        return [_Change(path, ("file",), "", (), wheel_only=f"changes non-Python file {path}")]
    if before is None and after is not None and not path.endswith("/__init__.py"):
        return [_Change(path, ("file",), "module", (), after)]
    if before is None or after is None:
        what = "adds" if before is None else "removes"
        return [_Change(path, ("file",), "", (), wheel_only=f"{what} the file {path}")]
    old, new = _units(before, path), _units(after, path)
    changes: list[_Change] = []
    for key, node in new.items():
        text = unit_source(after, node)
        prior = old.get(key)
        if prior is not None and unit_source(before, prior) == text:
            continue
        names = tuple(bound_names(node))
        if key[0] == "def" and prior is not None:
            changes.append(_Change(path, key, "replace", names, text))
        elif key[0] == "class" and prior is not None:
            assert isinstance(prior, ast.ClassDef)
            assert isinstance(node, ast.ClassDef)
            changes += _method_changes(path, key, prior, node, (before, after))
        elif prior is None and (key[0] in ("def", "class", "from", "import")
                                or (key[0] == "assign" and _is_literal(node))):
            changes.append(_Change(path, key, "provide", names, text))
        elif key[0] == "from" and prior is not None:
            assert isinstance(prior, ast.ImportFrom)
            assert isinstance(node, ast.ImportFrom)
            added = _added_from_import(prior, node)
            if added is None:
                changes.append(_Change(path, key, "", names, wheel_only=(
                    f"changes an import in {path} other than by adding names")))
            else:
                added_names = tuple(bound_names(ast.parse(added).body[0]))
                changes.append(_Change(path, (*key, "added"), "provide", added_names, added))
        else:
            changes.append(_Change(path, key, "", names, wheel_only=(
                f"changes module-level code in {path} ({_describe(key)})")))
    for key in old.keys() - new.keys():
        changes.append(_Change(path, key, "", (), wheel_only=(
            f"removes {_describe(key)} from {path}")))
    return changes


def patch_commits(repo: Git, patch_ids: Sequence[str]) -> dict[str, str]:
    """Each patch of the series (in order) -> the commit ``git am`` made of it in the fork
    tree (the commits after ``upstream``)."""
    commits = [c.hexsha for c in repo.commits(f"{UPSTREAM_TAG}..HEAD")]
    if len(commits) != len(patch_ids):
        raise BuildError(f"the fork tree has {len(commits)} commits after '{UPSTREAM_TAG}' "
                         f"but the series has {len(patch_ids)} patches", where=str(repo.path),
                         fix="rebuild the stack so the tree matches its series")
    return dict(zip(patch_ids, commits, strict=True))


def generate_spec(repo: Git, patches: Mapping[str, str], *, prefix: str, package: str,
                  stack: str, distribution: str, version: str) -> Spec:
    """The hooks for ``patches`` (id -> commit) of the fork tree ``repo`` (package paths
    after ``prefix``: :attr:`Project.package_prefix`)."""
    per_patch: dict[str, list[_Change]] = {}
    for patch, commit in patches.items():
        changed = repo("diff-tree", "--no-commit-id", "--name-only", "-r", commit).split()
        changes: list[_Change] = []
        for full in changed:
            rel = full.removeprefix(prefix)
            if not full.startswith(prefix) or not rel.startswith(f"{package}/"):
                changes.append(_Change(rel, ("file",), "", (),
                                       wheel_only=f"changes {full}, outside the package"))
                continue
            changes += diff_file(rel, repo.show(f"{commit}^", full), repo.show(commit, full))
        per_patch[patch] = changes

    wheel_only: dict[str, str] = {p: next(c.wheel_only for c in ch if c.wheel_only)
                                  for p, ch in per_patch.items() if any(c.wheel_only for c in ch)}
    owners: dict[tuple[str, Key], list[str]] = {}
    for patch, changes in per_patch.items():
        for c in changes:
            owners.setdefault((c.path, c.key), []).append(patch)
    spread = True
    while spread:  # a patch sharing a unit with a wheel-only patch is wheel only too
        spread = False
        for (path, key), sharing in owners.items():
            bad = [p for p in sharing if p in wheel_only]
            for p in sharing:
                if bad and p not in wheel_only:
                    wheel_only[p] = f"shares {_describe(key)} in {path} with wheel-only {bad[0]}"
                    spread = True

    hooks: dict[tuple[str, Key], Hook] = {}
    for patch, changes in per_patch.items():
        if patch in wheel_only:
            continue
        for c in changes:
            if not c.kind or (c.path, c.key) in hooks:  # a unit several patches change
                continue
            source, upstream, full = c.source, None, prefix + c.path
            if c.kind == "replace":  # upstream's function and the series' final one
                (name,) = c.names
                upstream = sha256_text(_units_function(repo.show(UPSTREAM_TAG, full), name,
                                                       full))
                source = _units_function(repo.show("HEAD", full), name, full)
            hooks[(c.path, c.key)] = Hook(
                patch="+".join(owners[(c.path, c.key)]), kind=c.kind, path=c.path,
                module=c.path.removesuffix(".py").removesuffix("/__init__").replace("/", "."),
                names=c.names, source=source, patched_sha256=sha256_text(source),
                upstream_sha256=upstream)
    ordered = sorted(hooks.values(), key=lambda h: (
        {"module": 0, "provide": 1}.get(h.kind, 2), h.patch, h.module))
    return Spec(stack=stack, distribution=distribution, version=version, package=package,
                hooks=tuple(ordered),
                wheel_only=tuple(sorted(wheel_only.items())))


def _units_function(source: str | None, name: str, where: str) -> str:
    if source is None:
        raise BuildError(f"{where} is missing", where=where)
    text = ModuleUnits.parse(source, filename=where).function(name)
    if text is None:
        raise BuildError(f"no top-level function or method {name}", where=where)
    return text
