"""The JSON documents of a GPU run, typed (``test-ab.json`` is ``ab.results.AbRun``):
:func:`parse_bench` checks the keys the reports read of ``bench.json``, naming the file and
the dotted key.  Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict, cast

from sm120fork.util import typed


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


class CheckVerdict(TypedDict, total=False):
    """One output against its fp32 reference."""

    output: str
    stage: str  # eager or graph replay
    kind: str
    nonfinite: int
    ok: bool
    rel_l2: float | None
    max_abs: float | None
    reason: str


class BenchRecord(TypedDict, total=False):
    """One line of a bench: a method's state, a timed point, a floor, or the run's meta."""

    kind: str
    method: str
    status: str
    reason: str
    tokens: int
    hidden: int
    median_us: float | None
    p10_us: float
    p90_us: float
    samples: int
    rank_medians_us: list[float | None] | None
    rank_p90_us: list[float | None] | None
    #: a floor's reason it was not measured; the meta line's {what: why} of skipped rows
    skipped: str | dict[str, str] | None
    checks: list[CheckVerdict]
    failing_ranks: list[int]
    methods: list[str]
    shared: bool
    replays: int
    rotate: int
    calls_per_buffer: int


class BenchDoc(TypedDict, total=False):
    """``bench.json`` (one world size)."""

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
    world_size: int
    dtype: str
    variant: str
    wheel: str | None
    sha256: str | None
    record_sha256: str | None
    records: list[BenchRecord]


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


def parse_bench(data: object, where: str) -> BenchDoc:
    """``data`` (parsed ``bench.json``) typed, once the keys the reports read are there."""
    keys = typed.read(_BenchKeys, data, where, strict=False)
    needs = {"point": ("method", "tokens", "hidden"), "floor": ("method",), "method": ("method",)}
    for i, line in enumerate(keys.records):
        for name in needs.get(line.kind, ()):
            if getattr(line, name) is None:
                raise typed.MalformedError(where, f"records[{i}].{name}", "is missing")
    return cast(BenchDoc, data)
