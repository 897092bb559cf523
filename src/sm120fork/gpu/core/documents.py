"""The JSON documents of a GPU run, typed: ``test-ab.json`` and ``bench.json``.

:func:`parse_ab` and :func:`parse_bench` check the keys the reports and records read,
naming the file and the dotted key.  Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, cast

from sm120fork.errors import ConfigError
from sm120fork.util import typed


class CaseSpec(TypedDict, total=False):
    api: str
    world_size: int
    pattern: str
    tokens: int
    hidden: int
    dtype: str
    strategy: str


class Check(TypedDict, total=False):
    """One output of a case compared with the fp32 reference."""

    output: str
    stage: str
    ok: bool
    rel_l2: float | None


class CaseResult(TypedDict, total=False):
    key: str
    case: CaseSpec
    status: str
    failure: str | None
    reason: str | None
    checks: list[Check]
    not_run: bool
    log_tail: dict[str, list[str]]


class VariantInfo(TypedDict, total=False):
    wheel: str | None
    sha256: str | None
    record_sha256: str | None
    site: str | None
    flashinfer: str | None
    compiled: bool
    compile_failure: str | None
    prebuilt_modules: list[str]
    prebuilt_failure: str | None


class Environment(TypedDict, total=False):
    gpus: list[str]
    gpu_count: int
    capability: list[int] | None
    driver: str
    driver_cuda_api: int
    torch: str
    torch_cuda: str | None
    python: str
    flashinfer: str
    flashinfer_path: str
    flashinfer_git: str | None
    flashinfer_error: str
    multicast_supported_attr: int
    driver_query_error: str
    nvcc: str | None
    #: ``manifest.json`` of the primary wheel's build
    wheels_manifest: dict[str, object] | None


class MadeFrom(TypedDict, total=False):
    #: the route that installed it, where not the stack's build (``upstream``, ``plugin``)
    variant: str
    project: str | None
    series: str | None
    series_digest: str | None
    wheel: str | None
    wheel_sha256: str | None
    tested_sha256: str | None
    record_sha256: str | None


class Provenance(TypedDict):
    stack: str | None
    made_from: list[MadeFrom]


class LayerMachine(TypedDict, total=False):
    gpus: list[str]
    torch: str | None
    cuda: str | None


class _Head(TypedDict, total=False):
    kind: str
    created: str
    command: str
    title: str
    environment: Environment
    shared: bool
    not_run: list[str]
    module_seconds: float
    time_budget: float | None
    finished: bool
    stack: str | None
    made_from: list[MadeFrom]


class AbDoc(_Head, total=False):
    """``test-ab.json``."""

    quick: bool
    world_sizes: list[int]
    primary: str
    baseline: str | None
    variants: dict[str, VariantInfo]
    results: dict[str, list[CaseResult]]
    tolerances: list[list[str]]


class BenchRecord(TypedDict, total=False):
    """One line of a bench: a method's state, a timed point, a floor, or the run's meta."""

    kind: str
    method: str
    status: str
    reason: str | None
    tokens: int
    hidden: int
    median_us: float | None
    rank_medians_us: list[float | None] | None
    rank_p90_us: list[float | None] | None
    error: str | None
    #: a floor's reason it was not measured; the meta line's {what: why} of skipped rows
    skipped: str | dict[str, str] | None
    fused_api: str | None
    replays: int
    rotate: int
    calls_per_buffer: int


class BenchDoc(_Head, total=False):
    """``bench.json`` (one world size)."""

    world_size: int
    dtype: str
    variant: str
    wheel: str | None
    sha256: str | None
    record_sha256: str | None
    records: list[BenchRecord]


@dataclass(frozen=True)
class _CaseKeys:
    api: str
    world_size: int


@dataclass(frozen=True)
class _ResultKeys:
    key: str
    status: str
    case: _CaseKeys


@dataclass(frozen=True)
class _AbKeys:
    primary: str
    results: Mapping[str, tuple[_ResultKeys, ...]]
    variants: Mapping[str, VariantInfo] = field(default_factory=dict)
    environment: Environment = field(default_factory=Environment)


@dataclass(frozen=True)
class _BenchLine:
    kind: str = ""
    method: str | None = None
    tokens: int | None = None
    hidden: int | None = None


@dataclass(frozen=True)
class _BenchKeys:
    records: tuple[_BenchLine, ...] = ()
    environment: Environment = field(default_factory=Environment)


def parse_ab(data: object, where: str) -> AbDoc:
    """``data`` (parsed ``test-ab.json``) typed, once the keys the reports read are there."""
    keys = typed.read(_AbKeys, data, where, strict=False)
    if keys.primary not in keys.results:
        raise ConfigError(f"names no results of the primary variant {keys.primary!r}",
                          where=f"{where}: results",
                          fix=f"known: {', '.join(keys.results) or 'none'}")
    return cast(AbDoc, data)


def parse_bench(data: object, where: str) -> BenchDoc:
    """``data`` (parsed ``bench.json``) typed, once the keys the reports read are there."""
    keys = typed.read(_BenchKeys, data, where, strict=False)
    needs = {"point": ("method", "tokens", "hidden"), "floor": ("method",), "method": ("method",)}
    for i, line in enumerate(keys.records):
        for name in needs.get(line.kind, ()):
            if getattr(line, name) is None:
                raise typed.MalformedError(where, f"records[{i}].{name}", "is missing")
    return cast(BenchDoc, data)


def read(path: Path) -> object:
    return typed.json_file(path)
