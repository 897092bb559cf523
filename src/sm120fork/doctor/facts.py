"""The doctor's facts, typed: what :func:`.probe.collect` returns, ``--record FILE`` writes,
``--facts FILE`` reads back and :mod:`.rules` judges.

One reader, :func:`read_facts` (and :func:`parse_facts` for a parsed document), refuses a
record that is not one, naming the file and the dotted key
(``gpus.devices[0].capability: is an int, not a string``), before any rule reads it.
Standard library only: the doctor is vendored into the plugin wheel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from ..errors import ConfigError

SCHEMA = "sm120fork-doctor-facts/1"


class Device(TypedDict):
    index: int
    name: str
    capability: str          # "12.0"
    multicast: bool | None
    pci_bus_id: str | None
    numa_node: int | None


class Gpus(TypedDict):
    driver: str | None       # "13.0"; None with ``error``
    error: str | None
    devices: list[Device]    # in CUDA's (so SGLang's) order
    p2p: list[list[bool]]    # row can access column


class Link(TypedDict, total=False):
    """One directed peer write/read (``ipc.LinkResult.to_json``)."""
    writer: int
    owner: int
    writer_gpu: int
    owner_gpu: int
    sharing: dict[str, dict[str, str]]
    write_gbps: float | None
    read_gbps: float | None
    error: str | None
    seconds: float | None
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
    found_in: str


class Hook(TypedDict, total=False):
    hook: str
    state: str               # "applied", "not applied", ...
    why: str
    carried: bool


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


class Provenance(TypedDict):
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
    comm: Comm
    other_caches: list[str]
    prebuilt_providers: list[list[str]]
    disable_jit: bool


class Decision(TypedDict):
    tp: int
    fusion: bool | None
    line: str
    #: the all-reduce policy's lines SGLang logged there (absent in older records)
    policy_lines: NotRequired[list[str]]


class Decisions(TypedDict, total=False):
    """SGLang's --tp decisions (``decide``), or why they were not evaluated."""
    model: str
    source: str
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


class Requires(TypedDict, total=False):
    sglang: list[str]


class Facts(TypedDict, total=False):
    schema: str
    made_by: MadeBy
    environ: dict[str, str]
    skipped: dict[str, str]
    gpus: Gpus
    topology: str | None
    torch: Torch | None
    nvcc: Nvcc | None
    packages: dict[str, str | None]
    requires: Requires
    plugin: Plugin | None
    sglang_plugin_framework: bool | None
    #: where SGLang looks for the all-reduce policy and what is there (gpu/policy.py's)
    policy: dict[str, Any] | None
    modules: Modules | None
    peers: Peers | None
    flashinfer: FlashInfer | None
    decisions: Decisions | None


# --- the one reader -----------------------------------------------------------------------

_NAMES: dict[type, str] = {dict: "an object", list: "a list", str: "a string", int: "an int",
                           float: "a number", bool: "a bool", type(None): "null"}


def _kind(value: object) -> str:
    return _NAMES.get(type(value), type(value).__name__)


def _is(value: object, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where

    def value(self, value: object, key: str, *kinds: type) -> object:
        if not _is(value, kinds):
            wanted = " or ".join(_NAMES.get(k, k.__name__) for k in kinds)
            raise ConfigError(f"is {_kind(value)}, not {wanted}",
                              where=f"{self.where}: {key or '(top level)'}")
        return value

    def obj(self, value: object, key: str, *, null: bool = False) -> Mapping[str, object] | None:
        if value is None and null:
            return None
        return cast(Mapping[str, object], self.value(value, key, dict))

    def need(self, data: Mapping[str, object], name: str, key: str) -> object:
        dotted = f"{key}.{name}" if key else name
        if name not in data:
            raise ConfigError("is missing", where=f"{self.where}: {dotted}")
        return data[name]

    def field(self, data: Mapping[str, object], name: str, key: str, *kinds: type,
              required: bool = True) -> object:
        dotted = f"{key}.{name}" if key else name
        if name not in data and not required:
            return None
        return self.value(self.need(data, name, key), dotted, *kinds)

    def items(self, data: Mapping[str, object], name: str, key: str,
              *, required: bool = True) -> list[tuple[str, Mapping[str, object]]]:
        """The objects in the list ``name``, each with its dotted key."""
        dotted = f"{key}.{name}" if key else name
        value = self.field(data, name, key, list, required=required)
        rows = cast(list[object], value or [])
        return [(f"{dotted}[{i}]", cast(Mapping[str, object], self.obj(row, f"{dotted}[{i}]")))
                for i, row in enumerate(rows)]

    def strings(self, data: Mapping[str, object], name: str, key: str, *kinds: type) -> None:
        """An object whose every value is one of ``kinds``."""
        dotted = f"{key}.{name}" if key else name
        table = self.obj(self.need(data, name, key), dotted)
        for k, v in (table or {}).items():
            self.value(v, f"{dotted}.{k}", *kinds)


N = type(None)


def parse_facts(data: object, where: str) -> Facts:
    """``data`` (a parsed facts record) typed, once every key the rules read has its type;
    else ConfigError naming ``where`` and the dotted key."""
    r = _Reader(where)
    doc = cast(Mapping[str, object], r.obj(data, ""))
    if doc.get("schema") != SCHEMA:
        raise ConfigError(f"schema {doc.get('schema')!r}, this doctor reads {SCHEMA!r}",
                          where=where)
    r.obj(r.need(doc, "made_by", ""), "made_by")
    r.strings(doc, "environ", "", str)
    r.strings(doc, "skipped", "", str)
    r.strings(doc, "packages", "", str, N)
    gpus = cast(Mapping[str, object], r.obj(r.need(doc, "gpus", ""), "gpus"))
    r.field(gpus, "error", "gpus", str, N, required=False)
    r.field(gpus, "driver", "gpus", str, N, required=False)
    for key, d in r.items(gpus, "devices", "gpus"):
        r.field(d, "index", key, int)
        r.field(d, "name", key, str)
        r.field(d, "capability", key, str)
        r.field(d, "multicast", key, bool, N, required=False)
        r.field(d, "pci_bus_id", key, str, N, required=False)
        r.field(d, "numa_node", key, int, N, required=False)
    for i, row in enumerate(cast(list[object], r.field(gpus, "p2p", "gpus", list,
                                                       required=False) or [])):
        for j, cell in enumerate(cast(list[object], r.value(row, f"gpus.p2p[{i}]", list))):
            r.value(cell, f"gpus.p2p[{i}][{j}]", bool)
    for name in ("torch", "nvcc", "plugin", "policy", "modules", "flashinfer"):
        r.obj(doc.get(name), name, null=True)
    r.field(doc, "topology", "", str, N, required=False)
    r.field(doc, "sglang_plugin_framework", "", bool, N, required=False)
    requires = r.obj(doc.get("requires", {}), "requires")
    for i, req in enumerate(cast(list[object], r.field(requires or {}, "sglang", "requires",
                                                       list, required=False) or [])):
        r.value(req, f"requires.sglang[{i}]", str)
    peers = r.obj(doc.get("peers"), "peers", null=True)
    if peers is not None:
        r.field(peers, "processes_on_one_gpu", "peers", bool)
        for key, link in r.items(peers, "links", "peers"):
            for name in ("writer", "owner", "writer_gpu", "owner_gpu"):
                r.field(link, name, key, int)
            r.field(link, "ok", key, bool)
            r.field(link, "detail", key, str)
            for name in ("write_gbps", "read_gbps"):
                r.field(link, name, key, float, N, required=False)
    plugin = r.obj(doc.get("plugin"), "plugin", null=True)
    if plugin is not None:
        for key, hook in r.items(plugin, "hooks", "plugin", required=False):
            r.field(hook, "hook", key, str)
            r.field(hook, "state", key, str)
            r.field(hook, "why", key, str, N)
    fi = r.obj(doc.get("flashinfer"), "flashinfer", null=True)
    if fi is not None:
        archs = r.obj(fi.get("archs", {}), "flashinfer.archs")
        for cap, entry in (archs or {}).items():
            key = f"flashinfer.archs.{cap}"
            arch = cast(Mapping[str, object], r.obj(entry, key))
            for name in ("arch", "floor"):
                r.field(arch, name, key, str, N, required=False)
        comm = r.obj(fi.get("comm", {}), "flashinfer.comm", null=True)
        provenance = r.obj((comm or {}).get("provenance"), "flashinfer.comm.provenance",
                           null=True)
        for name in ("recorded", "sources", "mismatch"):
            r.field(provenance or {}, name, "flashinfer.comm.provenance", str, N,
                    required=False)
        for key, copy in r.items(comm or {}, "copies", "flashinfer.comm", required=False):
            r.field(copy, "path", key, str)
            r.field(copy, "load", key, bool)
            r.field(copy, "why", key, str)
    decisions = r.obj(doc.get("decisions"), "decisions", null=True)
    if decisions is not None:
        for key, d in r.items(decisions, "decisions", "decisions", required=False):
            r.field(d, "tp", key, int)
            r.field(d, "fusion", key, bool, N)
            r.field(d, "line", key, str)
            for i, x in enumerate(cast(list[object], r.field(d, "policy_lines", key, list,
                                                             required=False) or [])):
                r.value(x, f"{key}.policy_lines[{i}]", str)
    modules = r.obj(doc.get("modules"), "modules", null=True)
    if modules is not None:
        for i, m in enumerate(cast(list[object], r.field(modules, "present", "modules", list,
                                                         required=False) or [])):
            r.value(m, f"modules.present[{i}]", str)
    return cast(Facts, doc)


def read_facts(path: Path) -> Facts:
    """The facts recorded in ``path``, refused naming the file (and the key)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read a facts file: {exc.strerror}", where=str(path)) from exc
    except ValueError as exc:
        raise ConfigError(f"is not JSON: {exc}", where=str(path)) from exc
    return parse_facts(data, str(path))
