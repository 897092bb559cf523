"""The all-reduce + residual add + RMSNorm methods the bench compares, behind one interface.

Every method is one adapter (rank-side, :mod:`sm120fork.gpu.adapters`) registered here by
name with what it is and what it needs; the bench drives them all the same way
(:func:`drive`): a method that cannot run on this machine says why and is reported as
not runnable, one whose output does not match the fp32 reference is reported with its
failing check and never timed, and only the rest are timed.  Nothing here imports torch,
so the registry and the driver are unit-tested on CPU with fake adapters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

#: record statuses of a (method, point)
TIMED = "timed"
FAILED_CHECK = "failed_check"
NOT_RUNNABLE = "not_runnable"
ERROR = "error"
#: a method's first record: it is being set up (the last one seen names a crash's method)
STARTING = "starting"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodSpec:
    """One method: its name in reports and policies, what it does, what it runs on."""

    name: str
    label: str
    fused: bool  # all-reduce, residual add and RMSNorm in one kernel
    #: environment the method's rank group needs (NCCL reads its tuning at init, so a
    #: tuned NCCL row runs in its own group)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: our fused kernel (the path SGLang's S2/G2 decide on), as opposed to the others
    ours: bool = False
    #: the FlashInfer module the module step builds for it (besides comm and norm)
    module: str | None = None
    #: how SGLang runs it when a policy names it (a key of ROUTES); None: SGLang cannot
    #: select it (a bench-only variant), so a policy never names it
    route: str | None = None
    #: what the serving process needs for it (:mod:`.decision` checks these): one of
    #: these importable names ("module" or "module:attribute"); the dtypes, world sizes
    #: and GPU majors it runs with (empty: any); the most tokens it takes (None: any);
    #: whether it can be recorded into a CUDA graph
    needs_any: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    world_sizes: tuple[int, ...] = ()
    gpu_majors: tuple[int, ...] = ()
    max_tokens: int | None = None
    in_graphs: bool = True


#: NCCL settings for small messages from the facts file (SM12x PCIe boxes): the LL
#: protocol over a ring, the lowest-latency pair for messages of a few KB to ~100 KB.
NCCL_TUNED_ENV: Mapping[str, str] = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}

#: How SGLang runs each method a policy may name (the keys are what SGLang's side switches
#: on; :mod:`.decision` and docs/policy.md describe them).
ROUTES: Mapping[str, str] = {
    "fused": "SGLang's FlashInfer all-reduce + add + RMSNorm fusion (our fused path; "
             "FlashInfer picks one-shot or two-shot)",
    "pcie_ipc": "SGLang's pcie_ipc all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE), then its "
                "fused_add_rmsnorm",
    "b12x": "b12x's fused all-reduce + add + RMSNorm (flashinfer.experimental.b12x)",
    "sglang_dispatch": "SGLang's own unfused all-reduce (its custom all-reduce where it "
                       "applies, else NCCL; pcie_ipc off), then its fused_add_rmsnorm",
}

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec(name="nccl_rmsnorm", label="NCCL all-reduce + fused_add_rmsnorm (defaults)",
               fused=False, route="sglang_dispatch"),
    MethodSpec(name="nccl_tuned_rmsnorm",
               label="NCCL all-reduce (NCCL_PROTO=LL, NCCL_ALGO=Ring) + fused_add_rmsnorm",
               fused=False, env=NCCL_TUNED_ENV),
    MethodSpec(name="fused_oneshot", label="our fused kernel, one-shot (Lamport)",
               fused=True, ours=True),
    MethodSpec(name="fused_twoshot", label="our fused kernel, two-shot", fused=True,
               ours=True),
    MethodSpec(name="fused_auto", label="our fused kernel, FlashInfer's one/two-shot choice",
               fused=True, ours=True, route="fused",
               needs_any=("flashinfer.comm:trtllm_allreduce_fusion",),
               dtypes=("bf16", "fp16")),
    MethodSpec(name="pcie_ipc_rmsnorm",
               label="FlashInfer pcie_ipc all-reduce + fused_add_rmsnorm", fused=False,
               module="pcie_ipc", route="pcie_ipc",
               needs_any=("flashinfer.comm:PcieIpcAllReduceWorkspace",),
               dtypes=("bf16",), world_sizes=(2, 4, 8)),
    MethodSpec(name="custom_vllm_rmsnorm",
               label="FlashInfer's vLLM custom all-reduce + fused_add_rmsnorm", fused=False,
               module="vllm"),
    MethodSpec(name="custom_sglang_rmsnorm",
               label="SGLang's custom all-reduce (sgl_kernel) + fused_add_rmsnorm",
               fused=False, route="sglang_dispatch"),
    MethodSpec(name="b12x_fused", label="b12x PCIe one-shot all-reduce + add + RMSNorm",
               fused=True, route="b12x",
               needs_any=("flashinfer.experimental.b12x",),
               dtypes=("bf16",), gpu_majors=(12,), max_tokens=36),
)}

#: what SGLang runs where nothing else can: its own unfused dispatch, always usable
UNFUSED = "nccl_rmsnorm"

#: the method every other is compared with in reports (the projection, the targets)
BASELINE = "nccl_rmsnorm"


def group_envs(names: Iterable[str]) -> dict[tuple[tuple[str, str], ...], list[str]]:
    """Methods grouped by the environment their rank group needs (one group each)."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in names:
        key = tuple(sorted(METHODS[name].env.items()))
        groups.setdefault(key, []).append(name)
    return groups


def modules(names: Iterable[str]) -> list[str]:
    """The optional modules the module step builds for these methods."""
    return sorted({m for n in names if (m := METHODS[n].module)})


def select(names: Sequence[str] | None) -> list[str]:
    """The methods to run, in registry order; unknown names are refused by the caller."""
    if not names:
        return list(METHODS)
    return [name for name in METHODS if name in set(names)]


@dataclasses.dataclass(frozen=True)
class Point:
    tokens: int
    hidden: int


class Adapter(Protocol):
    """What the driver needs of a method inside a rank."""

    name: str

    def unavailable(self) -> str | None:
        """Why this method cannot run in this process at all (None: it can)."""

    def unsupported(self, point: Point) -> str | None:
        """Why it cannot run this shape (None: it can)."""


#: check(adapter, point) -> (ok, checks); time(adapter, point) -> stats;
#: emit(record) sends a record to the launcher; sync() is a barrier between ranks
Check = Callable[[Any, Point], tuple[bool, list[dict[str, Any]]]]
Time = Callable[[Any, Point], dict[str, Any]]


def agree(reasons: Sequence[str | None]) -> str | None:
    """One verdict for the group from every rank's: a method runs only if it runs on all."""
    bad = [(rank, r) for rank, r in enumerate(reasons) if r]
    if not bad:
        return None
    rank, reason = bad[0]
    return reason if len(bad) == len(reasons) else f"rank {rank}: {reason}"


def drive(adapters: Sequence[Any], points: Sequence[Point], *, check: Check, time: Time,
          emit: Callable[[dict[str, Any]], None],
          gather: Callable[[Any], list[Any]] = lambda x: [x],
          is_fatal: Callable[[BaseException], bool] = lambda _exc: False) -> None:
    """Check, then time, every runnable method at every point; report the others.

    Methods one after the other, each over every point; a ``kind: method`` record
    with status ``starting`` before each tells the launcher which method was running
    if the ranks die.

    ``gather`` collects one value from every rank (identity on one rank), so that every
    rank takes the same branch: a method is checked only where every rank can run it,
    and timed only where every rank's check passed.  ``is_fatal`` says which errors
    poisoned the process (they propagate; the launcher restarts nothing for the bench).
    """
    # Method by method, each set up just before its points: a method that kills the
    # ranks (a CUDA error poisons the context) leaves the methods before it measured,
    # and its "starting" record tells the launcher which one to skip when it resumes.
    for adapter in adapters:
        emit({"kind": "method", "method": adapter.name, "status": STARTING})
        try:
            own = adapter.unavailable()
        except Exception as exc:
            if is_fatal(exc):
                raise
            own = f"set-up failed: {type(exc).__name__}: {exc}"[:500]
        reason = agree(gather(own))
        if reason:
            emit({"kind": "method", "method": adapter.name, "status": NOT_RUNNABLE,
                  "reason": reason})
            continue
        for point in points:
            record: dict[str, Any] = {"kind": "point", "method": adapter.name,
                                      "tokens": point.tokens, "hidden": point.hidden}
            reason = agree(gather(adapter.unsupported(point)))
            if reason:
                emit({**record, "status": NOT_RUNNABLE, "reason": reason})
                continue
            try:
                ok, checks = check(adapter, point)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                ok, checks = False, [{"output": "call", "ok": False,
                                      "reason": f"{type(exc).__name__}: {exc}"[:500]}]
            verdicts = gather((ok, checks))
            if not all(v[0] for v in verdicts):
                failing = [rank for rank, v in enumerate(verdicts) if not v[0]]
                worst = verdicts[failing[0]][1]
                emit({**record, "status": FAILED_CHECK, "failing_ranks": failing,
                      "checks": worst,
                      "reason": "; ".join(str(c.get("reason")) for c in worst
                                          if not c.get("ok"))[:800]})
                continue
            try:
                stats = time(adapter, point)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                stats = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            every = gather(stats)
            if any("error" in s for s in every):
                emit({**record, "status": ERROR,
                      "reason": next(s["error"] for s in every if "error" in s)})
                continue
            emit({**record, "status": TIMED, **stats,
                  "checks": checks,
                  "rank_medians_us": [s["median_us"] for s in every],
                  "rank_p90_us": [s["p90_us"] for s in every]})
