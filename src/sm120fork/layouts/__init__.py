"""Upstream SGLang layouts (where a release keeps the code the series changes), named by
``layout =`` in ``forks/<stack>.toml``: what differs lives in ``layouts.<name>`` (checks,
probe, layer-harness setup); a new layout is a module and a line in ``LAYOUTS``.
Here too what a layer case's ranks report, below both the harness (gpu/layer) and the
checks.  Standard library only: the layer harness's ranks import it beside the tree under
test."""

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
    return LAYOUTS[name].split()[0].replace(".", "/") + ".py"


def fitting(files: frozenset[str] | set[str]) -> list[str]:
    return [name for name in LAYOUTS
            if marker(name) in files or marker(name)[:-3] + "/__init__.py" in files]


def adapter(name: str) -> ModuleType:
    """The layout's module: its probe, checks and layer-harness setup."""
    if name not in LAYOUTS:
        raise KeyError(f"unknown SGLang layout {name!r} (known: {', '.join(LAYOUTS)})")
    return importlib.import_module(f"{__name__}.{name}")


def defaults(cls: Any) -> Any:
    """``cls`` (``ServerArgs``) with its defaults, skipping ``__post_init__`` (asks the GPU)."""
    obj = cls.__new__(cls)
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            setattr(obj, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            setattr(obj, field.name, field.default_factory())
    return obj


FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
#: What a rank whose fused call raised alone must say (the series' words, every layout's;
#: each layout's module imports it: ``adapter(layout).RAISED_ALONE_SAYS``).
RAISED_ALONE_SAYS = "peers did not fail with it"


@dataclasses.dataclass
class Layer:
    layout: str
    fusion: Any
    layernorm: Any
    gate: Callable[[int], bool]

    @classmethod
    def of(cls, layout: str, gate_module: str, gate: str) -> Layer:
        """SGLang's fusion and layernorm modules, and the fused-norm gate ``gate_module.gate``."""
        fusion = importlib.import_module(FUSION_MODULE)
        module = importlib.import_module(gate_module)
        return cls(layout=layout, fusion=fusion,
                   layernorm=importlib.import_module("sglang.srt.layers.layernorm"),
                   gate=lambda tokens: bool(getattr(module, gate)(tokens)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One token count: the path it took, and its errors against the float32 reference."""

    tokens: int
    path: str
    norm_error: float
    residual_error: float
    correct: bool
    gate: bool | None = None
    route: str | None = None
    graph: bool = False
    #: why the step could not run here (its route is still judged, its output not)
    skipped: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """What one rank of a layer case reported."""

    rank: int
    layout: str
    injected: str | None = None
    gate_after: bool = False
    unavailable: bool = False
    warnings: tuple[str, ...] = ()
    plugin: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    pcie_ipc_built: bool = False
    pcie_ipc_log: tuple[str, ...] = ()
    #: the CPU stand-in's workspace buffers still allocated (None on a GPU)
    fake_buffers_alive: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Raised:
    rank: int
    error: str
    after_fused_call_error_s: float | None = None
    agreement_timeout_s: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ended:
    """How one rank ended (``ended_after_ready_s``: seconds after every rank was ready)."""

    rank: int
    exit: int | None
    stopped_by_harness: bool
    ended_after_ready_s: float | None
    raised: Raised | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseOutcome:
    """One case of the layer harness (:func:`sm120fork.gpu.layer.run.run_case`)."""

    case: str
    passed: bool
    hung: bool
    problems: list[str]
    ranks: list[Observation]
    seconds: float
    tails: list[str]
    exits: list[Ended] = dataclasses.field(default_factory=list)
    #: "patched" (the stack's SGLang wheel) or "plugin" (stock SGLang + the plugin)
    variant: str = "patched"
