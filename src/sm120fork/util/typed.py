"""The one reader of parsed JSON or TOML into frozen dataclasses, by their annotations;
a refusal names the file and the dotted key (``forks/x.toml: projects.a.git.commit: is
int, not str``).  Standard library only."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sm120fork.errors import ConfigError

_T = TypeVar("_T")


class MalformedError(ConfigError):
    def __init__(self, where: str | Path, key: str, what: str, fix: str | None = None) -> None:
        self.key = key or "(top level)"
        super().__init__(what, where=f"{where}: {self.key}" if str(where) else self.key,
                         fix=fix)


def kind(value: object) -> str:
    return {dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def suggest(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def read(cls: type[_T], data: object, where: str | Path, key: str = "", *,
         strict: bool = True) -> _T:
    """``data`` as a ``cls``; unknown keys are refused (``strict``) or ignored."""
    return typing.cast(_T, _value(cls, data, _At(str(where), key, strict)))


def json_file(path: Path, where: str | Path | None = None) -> object:
    shown = str(where if where is not None else path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror}", where=shown) from exc
    except ValueError as exc:
        raise ConfigError(f"is not JSON: {exc}", where=shown) from exc


@dataclasses.dataclass(frozen=True)
class _At:
    where: str
    key: str
    strict: bool

    def below(self, name: str) -> _At:
        return dataclasses.replace(self, key=f"{self.key}.{name}" if self.key else name)

    def item(self, index: int) -> _At:
        return dataclasses.replace(self, key=f"{self.key}[{index}]")

    def error(self, what: str, fix: str | None = None) -> MalformedError:
        return MalformedError(self.where, self.key, what, fix)


#: A dataclass's field types, looked up once per class.
_hints = functools.cache(typing.get_type_hints)


def _object(cls: Any, data: object, at: _At) -> object:  # a dataclass
    if not isinstance(data, dict):
        raise at.error(f"is {kind(data)}, not an object")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    if at.strict:
        for name in data:
            if name not in fields:
                raise at.below(name).error("unknown key", suggest(name, fields)
                                           or f"known: {', '.join(fields)}")
    values = {}
    for name, spec in fields.items():
        if name in data:
            values[name] = value = _value(hints[name], data[name], at.below(name))
            regex, what = spec.metadata.get("pattern", (None, ""))
            if regex and value is not None and not regex.fullmatch(value):
                raise at.below(name).error(f"{value!r} is not {what}")
        elif (spec.default is dataclasses.MISSING
              and spec.default_factory is dataclasses.MISSING):
            raise at.below(name).error("is missing")
    return cls(**values)


def _value(hint: Any, value: object, at: _At) -> object:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _object(hint, value, at)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value, at)
    if hint is Any or hint is object:
        return value
    if typing.is_typeddict(hint):  # a document's own shape, checked by its reader
        return _instance(dict, value, at)
    if origin in (tuple, list):
        items = _instance(list, value, at)
        return origin(_value(args[0], item, at.item(i)) for i, item in enumerate(items))
    if origin in (Mapping, dict):
        table = _instance(dict, value, at)
        return {k: _value(args[1], v, at.below(k)) for k, v in table.items()}
    if origin is typing.Literal:
        if value not in args:
            raise at.error(f"{value!r} is not one of {', '.join(map(str, args))}",
                           suggest(str(value), map(str, args)) or None)
        return value
    if isinstance(hint, type) and hint.__module__ != "builtins" and isinstance(value, str):
        try:  # a type written as its text (a packaging Requirement)
            return hint(value)
        except ValueError as exc:
            raise at.error(f"{value!r} is not a valid {hint.__name__.lower()}: {exc}") from exc
    return _instance(hint, value, at)


def _instance(cls: type[_T], value: object, at: _At) -> _T:
    if cls is float and isinstance(value, int) and not isinstance(value, bool):
        return typing.cast(_T, float(value))
    # bool is an int to isinstance; a JSON true is no count.
    if not isinstance(value, cls) or (isinstance(value, bool) and cls is not bool):
        name = "an object" if cls is dict else "a list" if cls is list else cls.__name__
        raise at.error(f"is {kind(value)}, not {name}")
    return value


def pattern(regex: str, what: str) -> Mapping[str, object]:
    """``field(metadata=pattern(...))``: :func:`read` refuses a text ``regex`` does not match,
    saying it is not ``what``."""
    return {"pattern": (re.compile(regex), what)}


#: ``field(metadata=OMIT_EMPTY)``: :func:`dump` leaves the field out while it is None or "".
OMIT_EMPTY = {"omit_empty": True}


def dump(value: object, *, nulls: bool = False) -> Any:
    """The inverse of :func:`read`: a None field is left out (it reads back as its default)
    unless ``nulls``, a field of :data:`OMIT_EMPTY` whenever empty."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(v, nulls=nulls) for f in dataclasses.fields(value)
                if not (((v := getattr(value, f.name)) is None and not nulls)
                        or (v in (None, "") and "omit_empty" in f.metadata))}
    if isinstance(value, tuple | list):
        return [dump(v, nulls=nulls) for v in value]
    if isinstance(value, Mapping):
        return {k: dump(v, nulls=nulls) for k, v in value.items()}
    return value
