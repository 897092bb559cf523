"""The plugin's run-time half: check each generated hook against the installed SGLang, apply.

Ships unchanged in the plugin wheel and is imported by the generator, so both hash sources
with the same code; standard library only.  A hook is one top-level unit our series changes:
``replace`` (a function or ``Class.method`` upstream has: applies only where the installed
source hashes to upstream's, through SGLang's ``HookRegistry``), ``provide`` (names the
series adds to a module) or ``module`` (a file the series adds).  All or nothing: every hook
is checked and prepared first, and a failure takes ours out again, so SGLang stays stock;
SGLang's ``load_plugins()`` applies the hooks once every plugin registered.  One line per
hook, once per process; ``SM120FORK_PLUGIN=0`` disables it; nothing raises into SGLang.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import textwrap
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger("sm120fork.plugin")

DISABLE_ENV = "SM120FORK_PLUGIN"
SCHEMA = 1
APPLIED = "applied"
NOT_NEEDED = "not needed"
NOT_APPLIED = "not applied"
WHEEL_ONLY = "wheel only"

#: What the plugin did in this process ("report" is absent until it ran).
_STATE: dict[str, list[HookStatus]] = {}


# --- Source units: shared by the generator and the run time -------------------------------

def unit_source(source: str, node: ast.stmt) -> str:
    """The exact text of one top-level statement, decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    assert node.end_lineno is not None
    lines = source.splitlines(keepends=True)[first - 1:node.end_lineno]
    return "".join(lines).rstrip() + "\n"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def bound_names(node: ast.stmt) -> list[str]:
    """The module-level names one top-level statement binds (empty for other statements)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _binding(node: ast.stmt, name: str, text: str) -> str:
    """How a statement binds ``name``: imports by what they import, the rest by source."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        origin = "." * node.level + (node.module or "") if isinstance(node, ast.ImportFrom) \
            else ""
        for alias in node.names:
            if (alias.asname or alias.name).split(".")[0] == name:
                return f"import {origin}:{alias.name}"
    return f"source {sha256_text(text)}"


@dataclass(frozen=True)
class ModuleUnits:
    """A module's top-level statements: the source and binding of each name."""

    source: str
    tree: ast.Module
    bindings: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, source: str, filename: str = "<module>") -> ModuleUnits:
        tree = ast.parse(source, filename=filename)
        bindings: dict[str, str] = {}
        for node in tree.body:
            text = unit_source(source, node)
            for name in bound_names(node):
                bindings[name] = _binding(node, name, text)
        return cls(source=source, tree=tree, bindings=bindings)

    def function(self, name: str) -> str | None:
        """The source of the top-level function ``name``, or of the method ``Class.name``
        of a top-level class (None if there is none)."""
        *outer, last = name.split(".")
        body: list[ast.stmt] = self.tree.body
        for part in outer:
            body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == part),
                        [])
        return next((unit_source(self.source, n) for n in body
                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == last),
                    None)


# --- The generated specification ------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Hook:
    patch: str
    kind: str                       # "replace" | "provide" | "module"
    module: str                     # dotted module name
    path: str                       # file path relative to the package's parent directory
    names: tuple[str, ...]          # replace: one function name; provide: the names bound
    source: str                     # our (patched) source of the unit
    patched_sha256: str
    upstream_sha256: str | None     # replace only

    @property
    def label(self) -> str:
        if self.kind == "module":
            return f"{self.patch} {self.module} (new module)"
        return f"{self.patch} {self.module}.{','.join(self.names)}"

    @property
    def carried(self) -> bool:
        """A ``provide`` of module globals only (imports, constants) that the replaced
        functions use: carried along, not a change of its own, so not a start-up line."""
        if self.kind != "provide":
            return False
        try:
            body = ast.parse(textwrap.dedent(self.source)).body
        except SyntaxError:
            return False
        return not any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                       for n in body)


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What the build generated: the SGLang it targets, its hooks, its wheel-only patches."""

    schema: int = SCHEMA
    stack: str
    distribution: str
    version: str
    package: str
    hooks: tuple[Hook, ...]
    wheel_only: tuple[tuple[str, str], ...] = ()   # (patch, why)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "wheel_only": [{"patch": p, "why": w} for p, w in self.wheel_only]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Spec:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"hook specification schema {data.get('schema')!r}, "
                             f"this runtime reads {SCHEMA}")
        hooks = tuple(Hook(**{**h, "names": tuple(h["names"])}) for h in data["hooks"])
        wheel_only = tuple((w["patch"], w["why"]) for w in data["wheel_only"])
        return cls(**{**data, "hooks": hooks, "wheel_only": wheel_only})


@dataclass(frozen=True, kw_only=True)
class HookStatus:
    label: str
    state: str      # APPLIED | NOT_NEEDED | NOT_APPLIED | WHEEL_ONLY
    why: str = ""
    #: module globals carried along for the replaced functions (:attr:`Hook.carried`)
    carried: bool = False

    @property
    def line(self) -> str:
        return f"sm120fork plugin: {self.label}: {self.state}" + (
            f" ({self.why})" if self.why else "")

    def to_json(self) -> dict[str, Any]:
        return {"hook": self.label, "state": self.state, "why": self.why,
                "carried": self.carried}


# --- Checking against the installed SGLang --------------------------------------------------

def _package_parent(package: str) -> Path | None:
    """The directory that holds ``package`` (found without importing it)."""
    module = sys.modules.get(package)
    locations: Sequence[str] | None = getattr(module, "__path__", None)
    if locations is None:
        spec = importlib.util.find_spec(package)
        locations = spec.submodule_search_locations if spec else None
    if not locations:
        return None
    return Path(next(iter(locations))).parent


def _judge(hook: Hook, units: ModuleUnits | str) -> tuple[str, str]:
    """(state, why) of one hook against the installed module (or why it could not be read)."""
    if isinstance(units, str):
        return NOT_APPLIED, units
    if hook.kind == "replace":
        (name,) = hook.names
        installed = units.function(name)
        if installed is None:
            return NOT_APPLIED, f"{hook.path} has no top-level function {name}"
        digest = sha256_text(installed)
        if digest == hook.patched_sha256:
            return NOT_NEEDED, "the installed sglang already has this change"
        if digest != hook.upstream_sha256:
            expected = str(hook.upstream_sha256)[:12]
            return NOT_APPLIED, (f"the installed {name} differs from upstream's "
                                 f"(sha256 {digest[:12]}, expected {expected})")
        return APPLIED, ""
    if hook.kind == "provide":
        ours = ModuleUnits.parse(hook.source).bindings
        present = {n for n in hook.names if n in units.bindings}
        if present == set(hook.names) and all(units.bindings[n] == ours.get(n)
                                              for n in hook.names):
            return NOT_NEEDED, "the installed sglang already has it"
        if present:
            return NOT_APPLIED, (f"{hook.path} already binds {', '.join(sorted(present))} "
                                 "otherwise")
        return APPLIED, ""
    return NOT_APPLIED, f"unknown hook kind {hook.kind!r}"


def _judge_module(hook: Hook, parent: Path) -> tuple[str, str]:
    """(state, why) of a module the series adds: applied where SGLang has no such file."""
    file = parent / hook.path
    if not file.exists():
        return APPLIED, ""
    try:
        digest = sha256_text(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return NOT_APPLIED, f"cannot read {hook.path}: {exc}"
    if digest == hook.patched_sha256:
        return NOT_NEEDED, "the installed sglang already has this module"
    return NOT_APPLIED, f"the installed sglang has a {hook.path} of its own"


def _refused(statuses: list[HookStatus], why: str) -> list[HookStatus]:
    """Every status that would apply, not applied with ``why``: all hooks or none."""
    return [replace(s, state=NOT_APPLIED, why=why) if s.state == APPLIED else s
            for s in statuses]


def evaluate(spec: Spec) -> list[HookStatus]:
    """What ``activate`` would do, without changing anything (reads files, imports nothing)."""
    try:
        installed: str | None = importlib.metadata.version(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    parent = _package_parent(spec.package) if installed else None
    parsed: dict[str, ModuleUnits | str] = {}
    statuses: list[HookStatus] = []
    for hook in spec.hooks:
        if installed is None:
            state, why = NOT_APPLIED, f"{spec.distribution} is not installed"
        elif installed.split("+", 1)[0] != spec.version:
            state, why = NOT_APPLIED, (f"installed {spec.distribution} {installed}; this "
                                       f"plugin is for {spec.version} (stack {spec.stack})")
        elif parent is None:
            state, why = NOT_APPLIED, "the installed package directory was not found"
        elif hook.kind == "module":
            state, why = _judge_module(hook, parent)
        else:
            if hook.path not in parsed:
                file = parent / hook.path
                try:
                    parsed[hook.path] = ModuleUnits.parse(file.read_text(encoding="utf-8"),
                                                          filename=str(file))
                except (OSError, UnicodeDecodeError, SyntaxError) as exc:
                    parsed[hook.path] = f"cannot read {hook.path}: {exc}"
            state, why = _judge(hook, parsed[hook.path])
        statuses.append(HookStatus(label=hook.label, state=state, why=why,
                                   carried=hook.carried))
    blockers = [s for s in statuses if s.state == NOT_APPLIED]
    if blockers:
        statuses = _refused(statuses, f"held back because {blockers[0].label} cannot apply; "
                                      "all hooks or none")
    statuses += [HookStatus(label=patch, state=WHEEL_ONLY,
                            why=f"{why}; the patched sglang wheel carries it")
                 for patch, why in spec.wheel_only]
    return statuses


# --- Applying ---------------------------------------------------------------------------

#: (register, unregister): put one REPLACE hook into SGLang's HookRegistry, take ours out.
Registry = tuple[Callable[[str, Callable[..., Any]], None],
                 Callable[[str, Callable[..., Any]], None]]


def _sglang_registry() -> Registry:
    hook_registry = importlib.import_module("sglang.srt.plugins.hook_registry")
    registry, replace_type = hook_registry.HookRegistry, hook_registry.HookType.REPLACE

    def register(target: str, fn: Callable[..., Any]) -> None:
        registry.register(target, fn, replace_type)

    def unregister(target: str, fn: Callable[..., Any]) -> None:
        hooks = registry._hooks.get(target)
        if hooks is not None:
            hooks[:] = [entry for entry in hooks if entry[1] is not fn]
            if not hooks:
                del registry._hooks[target]

    return register, unregister


def _compile_unit(hook: Hook, module: types.ModuleType, flags: int) -> dict[str, Any]:
    """Run one unit's source with the module's globals; return the names it bound.  A
    replaced function loses its decorators: they ran when SGLang imported the module
    (running them again would register twice)."""
    where = f"<sm120fork plugin {hook.path}>"
    tree = ast.parse(textwrap.dedent(hook.source), filename=where)
    for node in tree.body:
        if hook.kind == "replace" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.decorator_list = []
    code = compile(tree, where, "exec", flags=flags, dont_inherit=True)
    bound: dict[str, Any] = {}
    exec(code, vars(module), bound)
    return bound


def _new_module(hook: Hook) -> types.ModuleType:
    """Make the module a ``module`` hook adds, from its text (not yet installed)."""
    module = types.ModuleType(hook.module)
    module.__file__ = f"<sm120fork plugin {hook.path}>"
    module.__package__ = hook.module.rpartition(".")[0]
    code = compile(hook.source, module.__file__, "exec", dont_inherit=True)
    sys.modules[hook.module] = module  # while it runs: dataclasses look their module up
    try:
        exec(code, vars(module))
    finally:
        del sys.modules[hook.module]
    return module


def _prepare(hook: Hook) -> tuple[types.ModuleType, dict[str, Any]]:
    """Import the target, compile our unit; change nothing.  What to provide (name: value)
    or to register (target: function)."""
    module = importlib.import_module(hook.module)
    # ``from __future__ import annotations`` in the module applies to code added to it
    future = __future__.annotations
    bound = _compile_unit(hook, module, future.compiler_flag
                          if vars(module).get("annotations") is future else 0)
    if hook.kind == "provide":
        return module, {name: bound[name] for name in hook.names}
    (dotted,) = hook.names
    *outer, attr = dotted.split(".")
    current = vars(functools.reduce(getattr, outer, module)).get(attr)
    if not isinstance(current, types.FunctionType) or current.__code__.co_name != attr \
            or hasattr(current, "__wrapped__"):
        raise RuntimeError(f"{attr} is not the plain function upstream defines (a wrapping "
                           "decorator, or another plugin replaced it first)")
    if not isinstance(bound.get(attr), types.FunctionType):
        raise RuntimeError(f"our source of {dotted} defines no function {attr}")
    return module, {f"{hook.module}.{dotted}": bound[attr]}


def _apply(spec: Spec, statuses: list[HookStatus],
           registry: Registry | None) -> list[HookStatus]:
    """Prepare every hook; only if all succeeded, provide names and register REPLACEs
    (never ``HookRegistry.apply_hooks``: that would drop later plugins' hooks).  On any
    failure nothing of ours is left in the registry or the modules."""
    todo = [h for h, s in zip(spec.hooks, statuses, strict=False) if s.state == APPLIED]
    if not todo:
        return statuses
    register, unregister = registry or _sglang_registry()
    undo: list[Callable[[], object]] = []
    try:
        for hook in todo:  # new modules first: the other hooks' functions import them
            if hook.kind == "module":
                new = _new_module(hook)
                package, _, leaf = hook.module.rpartition(".")
                owner = importlib.import_module(package)
                sys.modules[hook.module] = new
                undo.append(functools.partial(sys.modules.pop, hook.module, None))
                setattr(owner, leaf, new)
                undo.append(functools.partial(delattr, owner, leaf))
        prepared = [(hook, *_prepare(hook)) for hook in todo if hook.kind != "module"]
        for hook, module, values in sorted(prepared, key=lambda p: p[0].kind == "replace"):
            for name, value in values.items():  # provides first, then the REPLACEs
                if hook.kind == "provide":
                    setattr(module, name, value)
                    undo.append(functools.partial(delattr, module, name))
                else:
                    register(name, value)
                    undo.append(functools.partial(unregister, name, value))
    except Exception as exc:
        for step in reversed(undo):
            with contextlib.suppress(Exception):
                step()
        return _refused(statuses, "preparing failed, SGLang left stock: "
                                  f"{type(exc).__name__}: {exc}")
    return statuses


def activate(spec: Spec, *,
             registry: Registry | None = None,
             environ: Mapping[str, str] = os.environ) -> list[HookStatus]:
    """Check every hook and apply all of them, or none; log one line per hook, once per
    process (a second call returns the first report).  Never raises."""
    if "report" in _STATE:
        return _STATE["report"]
    if environ.get(DISABLE_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        _STATE["report"] = []
        log.info("sm120fork plugin: disabled by %s=%s; SGLang is stock", DISABLE_ENV,
                 environ[DISABLE_ENV])
        return []
    try:
        statuses = _apply(spec, evaluate(spec), registry)
    except Exception as exc:  # the plugin must never break SGLang's start-up
        statuses = [HookStatus(label=h.label, state=NOT_APPLIED, carried=h.carried,
                               why=f"plugin error, nothing applied: {type(exc).__name__}: {exc}")
                    for h in spec.hooks]
    for status in statuses:
        if status.state == NOT_APPLIED:
            log.warning("%s", status.line)
        elif not status.carried:  # imports and constants the functions use: no line
            log.info("%s", status.line)
    _STATE["report"] = statuses
    return statuses


def _reset_for_tests() -> None:
    _STATE.clear()
