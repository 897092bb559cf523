"""Upstream SGLang layouts: where a release keeps the code the series changes.

A stack names its SGLang's layout in ``forks/<stack>.toml`` (``layout = "..."`` of the
sglang project).  Everything that differs between layouts lives in the layout's adapter
package, ``sm120fork.layouts.<name>``: its behaviour checks (scenarios and expectations)
and their probe, the GPU layer harness's setup and the fallback's wording.  Everything
else (the fake-GPU machinery, the process handling, the verdicts) is generic.  A stack on
a known layout needs a toml and patches only; a new layout is a new adapter package and
a line in ``LAYOUTS``.

This module imports nothing: the GPU layer harness's ranks import it beside the tree
under test, on machines without the toolkit's dependencies.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: name -> what marks it (the module SGLang's fused-norm gate lives in).
LAYOUTS: dict[str, str] = {
    "communicator": "sglang.srt.layers.communicator (SGLang 0.5.10)",
    "layer_boundary": "sglang.srt.layers.layer_boundary.residual.add_norm (SGLang 0.5.23)",
}


def marker(name: str) -> str:
    """The package-relative file of the module that marks layout ``name``."""
    return LAYOUTS[name].split()[0].replace(".", "/") + ".py"


def fitting(files: frozenset[str] | set[str]) -> list[str]:
    """The layouts whose marking module a release's files (package-relative) hold."""
    return [name for name in LAYOUTS
            if marker(name) in files or marker(name)[:-3] + "/__init__.py" in files]


def adapter(name: str, part: str = "") -> ModuleType:
    """The layout's adapter package, or one of its modules (``checks``, ``rank``)."""
    if name not in LAYOUTS:
        raise KeyError(f"unknown SGLang layout {name!r} (known: {', '.join(LAYOUTS)})")
    return importlib.import_module(f"{__name__}.{name}" + (f".{part}" if part else ""))


def defaults(cls: Any) -> Any:
    """An instance of dataclass ``cls`` (SGLang's ``ServerArgs``) with its field defaults,
    without running its ``__post_init__`` (which asks the GPU and the model)."""
    obj = cls.__new__(cls)
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            setattr(obj, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            setattr(obj, field.name, field.default_factory())
    return obj


@dataclasses.dataclass
class Layer:
    """A layout's SGLang modules in one GPU layer harness rank, wired to its TP group."""

    layout: str
    fusion: Any
    layernorm: Any
    gate: Callable[[int], bool]
