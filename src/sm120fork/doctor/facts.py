"""The doctor's facts, typed: what ``collect`` probes, ``--record`` writes and ``--facts``
reads back through :func:`parse_facts`, which names the file and the dotted key of a misfit.
"""

from types import UnionType
from typing import (
    Any,
    NotRequired,
    Required,
    TypedDict,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from ..errors import ConfigError

SCHEMA = "sm120fork-doctor-facts/1"


class Device(TypedDict):
    index: int
    name: str
    capability: str          # "12.0"
    multicast: NotRequired[bool | None]
    pci_bus_id: NotRequired[str | None]
    numa_node: NotRequired[int | None]


class Gpus(TypedDict, total=False):
    driver: str | None       # "13.0"; None with ``error``
    error: str | None
    devices: Required[list[Device]]    # in CUDA's (so SGLang's) order
    p2p: list[list[bool]]    # row can access column


class Link(TypedDict):
    """One directed peer write/read (``ipc.LinkResult.to_json``)."""
    writer: int
    owner: int
    writer_gpu: int
    owner_gpu: int
    sharing: NotRequired[dict[str, dict[str, str]]]
    write_gbps: NotRequired[float | None]
    read_gbps: NotRequired[float | None]
    error: NotRequired[str | None]
    seconds: NotRequired[float | None]
    ok: bool
    detail: str


class Peers(TypedDict):
    processes_on_one_gpu: bool
    links: list[Link]


class Torch(TypedDict, total=False):
    version: str | None
    cuda: str | None
    error: str


class Nvcc(TypedDict):
    path: str
    version: str
    found_in: NotRequired[str]


class Hook(TypedDict):
    hook: str
    state: str               # "applied", "not applied", ...
    why: str | None
    carried: NotRequired[bool]


class Plugin(TypedDict, total=False):
    hooks: list[Hook]
    stack: str | None
    error: str


class Arch(TypedDict, total=False):
    """What FlashInfer builds for one compute capability, and the CUDA it needs."""
    arch: str | None         # "120f"
    floor: str | None        # the oldest CUDA it accepts; None: no floor of its own
    error: str               # refused with this CUDA


class Copy(TypedDict):
    """FlashInfer's own verdict on one prebuilt copy of the comm module (our builds)."""
    path: str
    load: bool
    why: str


class Provenance(TypedDict, total=False):
    marker: str
    recorded: str | None
    sources: str | None
    mismatch: str | None


class Comm(TypedDict, total=False):
    spec_error: str
    copies: list[Copy]
    aot_path: str
    aot_exists: bool
    jit_path: str
    jit_exists: bool
    is_aot: bool
    provenance: Provenance | None   # None: stock FlashInfer (loads any prebuilt module)


class JitCache(TypedDict):
    version: str
    built_by: str | None


class FlashInfer(TypedDict, total=False):
    """What the FlashInfer child answered (``flashinfer_probe``), or why it did not."""
    probe_error: str
    import_error: str
    error: str
    version: str | None
    cuda_version: str | None
    cuda_from: str | None    # "nvcc" or "torch"
    nvcc: str | None
    aot_dir: str | None
    jit_dir: str | None
    jit_cache_package: bool
    jit_cache: JitCache | None
    archs: dict[str, Arch]
    comm: Comm | None
    other_caches: list[str]
    prebuilt_providers: list[list[str]]
    disable_jit: bool
    workspace_dir: str
    cache_root: str
    torch_cuda: str | None
    target_archs: list[str]
    target_archs_error: str
    cuda_error: str
    cuda_path_error: str
    errors: list[str]        # the probe's steps that failed


class Decision(TypedDict):
    tp: int
    fusion: bool | None
    backend: NotRequired[str | None]
    line: str
    #: the all-reduce policy's lines SGLang logged there (absent in older records)
    policy_lines: NotRequired[list[str]]


class Decisions(TypedDict, total=False):
    """SGLang's --tp decisions (``decide``), or why they were not evaluated."""
    model: str
    source: str
    plugins_loaded: bool
    decisions: list[Decision]
    error: str


class Modules(TypedDict, total=False):
    asked: list[str]
    present: list[str]
    error: str


class MadeBy(TypedDict):
    doctor: str | None
    python: str
    machine: str
    #: the interpreter examined (records made before it was kept lack it)
    executable: NotRequired[str]


class Facts(TypedDict, total=False):
    schema: str
    made_by: Required[MadeBy]
    environ: Required[dict[str, str]]
    skipped: Required[dict[str, str]]
    gpus: Required[Gpus]
    topology: str | None
    torch: Torch | None
    nvcc: Nvcc | None
    packages: Required[dict[str, str | None]]
    requires: dict[str, list[str]]   # per project: its Requires-Dist on FlashInfer
    plugin: Plugin | None
    sglang_plugin_framework: bool | None
    #: where SGLang looks for the all-reduce policy and what is there (gpu/policy.py's)
    policy: dict[str, Any] | None
    modules: Modules | None
    peers: Peers | None
    flashinfer: FlashInfer | None
    decisions: Decisions | None


_NAMES: dict[object, str] = {dict: "an object", list: "a list", str: "a string", int: "an int",
                             float: "a number", bool: "a bool", type(None): "null"}


def _base(kind: object) -> object:
    return dict if is_typeddict(kind) else get_origin(kind) or kind


def _fits(value: object, kind: object) -> bool:
    base = _base(kind)
    if kind is Any:
        return True
    if isinstance(value, bool) or base is bool:
        return base is bool and isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float))
    return isinstance(value, base)  # type: ignore[arg-type]


def _read(value: Any, kind: object, key: str, where: str) -> None:
    """``value`` is of ``kind`` (a type of this module), down to its last key; else
    ConfigError naming ``where`` and the dotted key."""
    kinds = get_args(kind) if get_origin(kind) is UnionType else (kind,)
    fit = next((k for k in kinds if _fits(value, k)), None)
    if fit is None:
        wanted = " or ".join(_NAMES[_base(k)] for k in kinds)
        raise ConfigError(f"is {_NAMES.get(type(value), type(value).__name__)}, not {wanted}",
                          where=f"{where}: {key or '(top level)'}")
    if is_typeddict(fit):
        # which keys are required: __required_keys__ (this module's annotations are
        # evaluated, no __future__ import, so it reads Required/NotRequired)
        for name, hint in get_type_hints(fit).items():
            dotted = f"{key}.{name}" if key else name
            if name in value:
                _read(value[name], hint, dotted, where)
            elif name in fit.__required_keys__:
                raise ConfigError("is missing", where=f"{where}: {dotted}")
    elif get_origin(fit) is list:
        for i, item in enumerate(value):
            _read(item, get_args(fit)[0], f"{key}[{i}]", where)
    elif get_origin(fit) is dict:
        for name, item in value.items():
            _read(item, get_args(fit)[1], f"{key}.{name}", where)


def parse_facts(data: object, where: str) -> Facts:
    """``data`` (a parsed facts record of this schema) typed, once every key has its type;
    else ConfigError naming ``where`` and the dotted key."""
    _read(data, Facts, "", where)
    return cast(Facts, data)
