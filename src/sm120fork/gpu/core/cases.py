"""The correctness matrix and the benchmark points: plain data.  Token counts sit on both
sides of every dispatch threshold of FlashInfer 0.6.7.post3 and SGLang's 2048-token cap."""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from collections.abc import Iterable, Mapping, Sequence

from sm120fork.errors import ConfigError

FUSION_APIS = ("fusion_legacy", "fusion_unified")
CUSTOM_API = "custom_lamport"
APIS = (*FUSION_APIS, CUSTOM_API)

#: FlashInfer ``AllReduceFusionPattern`` codes, by the names the report uses.
PATTERN_CODES = {
    "allreduce": 0,
    "ar_rmsnorm": 1,
    "ar_rmsnorm_fp8": 2,
    "ar_rmsnorm_fp4": 3,
    "ar_rmsnorm_out_fp8": 4,
    "ar_rmsnorm_out_fp4": 5,
}
#: The legacy custom all-reduce's lamport path exists only for this fusion op.
CUSTOM_PATTERN = "ar_rmsnorm"
#: Why a bench row on NCCL does not run where ranks share a GPU.
NCCL_SHARED = ("ranks share a GPU: NCCL refuses two ranks on one GPU, so this row cannot run "
               "on this machine")

TOKENS = (1, 2, 4, 8, 15, 16, 17, 32, 64, 127, 128, 129, 512, 1024, 2048)
HIDDEN = (2048, 4096, 7168, 8192)
DTYPES = ("bf16", "fp16")
STRATEGIES = ("oneshot", "twoshot", "auto")
#: ``trtllm_custom_all_reduce`` takes the lamport path at <= 16 tokens; 17 and 64 are the
#: controls on the other side of the threshold.
LAMPORT_TOKEN_THRESHOLD = 16
CUSTOM_TOKENS = (1, 2, 4, 8, 15, 16, 17, 64)

BENCH_TOKENS = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512)
BENCH_TOKENS_QUICK = (1, 3, 16, 64, 128, 512)
BENCH_HIDDEN = (7168, 6144, 4096)
BENCH_HIDDEN_QUICK = (7168,)


@dataclasses.dataclass(frozen=True, kw_only=True, order=True)
class Case:
    """One correctness case; every rank of one world runs it together."""

    world_size: int
    api: str
    pattern: str
    tokens: int
    hidden: int
    dtype: str
    strategy: str
    pdl: bool

    def __post_init__(self) -> None:
        for name, known in (("api", APIS), ("pattern", tuple(PATTERN_CODES)),
                            ("dtype", DTYPES), ("strategy", STRATEGIES)):
            if (value := getattr(self, name)) not in known:
                raise ConfigError(f"unknown {name} {value!r}", fix=f"one of {known}")
        if self.world_size < 2 or self.tokens < 1 or self.hidden < 1:
            raise ConfigError(f"bad sizes in case {self}")

    @property
    def key(self) -> str:
        """Stable identity across variants and runs (the A/B join key)."""
        return (f"{self.api}/{self.pattern}/ws{self.world_size}/t{self.tokens}"
                f"/h{self.hidden}/{self.dtype}/{self.strategy}/pdl{int(self.pdl)}")

    @property
    def seed(self) -> int:
        """Seed from which every rank regenerates every rank's inputs."""
        return zlib.crc32(self.key.encode()) & 0x7FFFFFFF

    @property
    def lamport(self) -> bool:
        """Whether the legacy custom all-reduce takes its lamport one-shot path."""
        return self.api == CUSTOM_API and self.tokens <= LAMPORT_TOKEN_THRESHOLD


def skip_reason(case: Case, capability: tuple[int, int]) -> str | None:
    """Why ``case`` cannot run on a GPU of ``capability`` (None: it runs)."""
    if case.strategy == "twoshot" and case.tokens <= case.world_size:
        return "twoshot needs tokens > world size (FlashInfer asserts it)"
    if case.pattern.endswith("fp4") and capability < (10, 0):
        return f"FP4 quantization needs sm_100 or newer (GPU is sm_{capability[0]}{capability[1]})"
    if case.pattern.endswith("fp8") and capability < (8, 9):
        return f"FP8 needs sm_89 or newer (GPU is sm_{capability[0]}{capability[1]})"
    return None


#: FlashInfer 0.7.x makes the legacy fusion workspace as torch symmetric memory.
TORCH_SYMM_SHARED_GPU = (
    "needs a GPU per rank here: this FlashInfer's legacy fusion workspace is torch symmetric "
    "memory, whose rendezvous refuses ranks sharing one GPU (\"detected allocations from "
    "overlapping devices\")")


def _fusion(world_sizes: Iterable[int], apis: Iterable[str], patterns: Iterable[str],
            tokens: Iterable[int], hidden: Iterable[int], dtypes: Iterable[str],
            strategies: Iterable[str], pdls: Iterable[bool]) -> list[Case]:
    return [
        Case(world_size=w, api=a, pattern=p, tokens=t, hidden=h, dtype=d, strategy=s, pdl=q)
        for w, a, p, t, h, d, s, q in itertools.product(
            world_sizes, apis, patterns, tokens, hidden, dtypes, strategies, pdls)
    ]


def _custom(world_sizes: Iterable[int], tokens: Iterable[int], hidden: Iterable[int],
            dtypes: Iterable[str], pdls: Iterable[bool]) -> list[Case]:
    return _fusion(world_sizes, [CUSTOM_API], [CUSTOM_PATTERN], tokens, hidden, dtypes,
                   ["oneshot"], pdls)


def full_matrix(world_sizes: Sequence[int]) -> list[Case]:
    """Every pattern x API x threshold-straddling size the issue asks for."""
    cases = _fusion(world_sizes, FUSION_APIS, PATTERN_CODES, TOKENS, HIDDEN, DTYPES,
                    STRATEGIES, (False, True))
    cases += _custom(world_sizes, CUSTOM_TOKENS, HIDDEN, DTYPES, (False, True))
    return order(cases)


def quick_matrix(world_sizes: Sequence[int]) -> list[Case]:
    """A few hundred cases that still straddle each threshold and touch each path."""
    ws = list(world_sizes)
    cases = _fusion(ws, FUSION_APIS, ["ar_rmsnorm"], (1, 2, 16, 17, 128, 129, 1024),
                    (4096, 7168), ["bf16"], STRATEGIES, (False, True))
    cases += _fusion(ws, FUSION_APIS, ["allreduce"], (1, 17, 129), (4096,), ["bf16"],
                     STRATEGIES, (False,))
    cases += _fusion(ws, FUSION_APIS, ["ar_rmsnorm"], (16, 128), (7168,), ["fp16"],
                     ["auto"], (False,))
    cases += _fusion(ws, FUSION_APIS, ["ar_rmsnorm_fp8", "ar_rmsnorm_fp4"], (16, 128),
                     (4096,), ["bf16"], ["oneshot"], (False,))
    cases += _custom(ws, (1, 8, 16, 17, 64), (4096, 7168), ["bf16"], (False,))
    cases += _custom(ws, (8,), (4096,), ["fp16"], (True,))
    return order(cases)


def order(cases: Iterable[Case]) -> list[Case]:
    """By world size; within it the legacy custom all-reduce first, then the fusion APIs."""
    return sorted({c.key: c for c in cases}.values(),
                  key=lambda c: (c.world_size, (APIS.index(c.api) + 1) % len(APIS), c.key))


def phases(cases: Sequence[Case]) -> list[list[Case]]:
    """One-world-size batches, every custom all-reduce batch first (so a time budget cuts
    fusion cases, not the lamport path's A/B)."""
    def phase(c: Case) -> tuple[bool, int]:
        return (c.api != CUSTOM_API, c.world_size)

    return [[c for c in cases if phase(c) == p] for p in sorted(set(map(phase, cases)))]


def select(cases: Iterable[Case], *, apis: Sequence[str] | None = None,
           patterns: Sequence[str] | None = None, tokens: Sequence[int] | None = None,
           hidden: Sequence[int] | None = None, max_cases: int | None = None) -> list[Case]:
    """Filter the matrix by ``--api`` / ``--pattern`` / ``--tokens``; ``--hidden`` runs every
    selected case at these hidden sizes instead."""
    out = [c for c in cases
           if (not apis or c.api in apis) and (not patterns or c.pattern in patterns)
           and (not tokens or c.tokens in tokens)]
    if hidden:
        out = order(dataclasses.replace(c, hidden=h) for c in out for h in hidden)
    return out[:max_cases] if max_cases else out


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchPlan:
    """What one bench run measures."""

    world_size: int
    tokens: tuple[int, ...]
    hidden: tuple[int, ...]
    dtype: str = "bf16"
    replays: int = 30
    rotate: int = 8
    calls_per_buffer: int = 4
    floors: bool = True  # the empty-graph and flag-handoff floors (once per run)


def bench_plan(world_size: int, *, quick: bool, tokens: Sequence[int] | None = None,
               hidden: Sequence[int] | None = None) -> BenchPlan:
    base = (BenchPlan(world_size=world_size, tokens=BENCH_TOKENS_QUICK,
                      hidden=BENCH_HIDDEN_QUICK, replays=15) if quick
            else BenchPlan(world_size=world_size, tokens=BENCH_TOKENS, hidden=BENCH_HIDDEN))
    return dataclasses.replace(base, tokens=tuple(tokens or base.tokens),
                               hidden=tuple(hidden or base.hidden))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankSpec:
    """A rank group's spec file: what :class:`~sm120fork.gpu.core.worker.Rank` reads, then
    the A/B's ``cases`` or the bench's ``bench`` plan and ``methods``."""

    mode: str
    world_size: int
    store: str
    backend: str
    allow_multicast: bool
    max_tokens: int
    max_hidden: int
    custom_max_tokens: int
    cases: tuple[Case, ...] = ()
    bench: BenchPlan | None = None
    methods: tuple[str, ...] = ()
    module_failures: Mapping[str, str] = dataclasses.field(default_factory=dict)
