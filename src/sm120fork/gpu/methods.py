"""The all-reduce + residual add + RMSNorm methods: what each is (:data:`METHODS`, the
bench measures every one), and how SGLang runs those a policy may name (:data:`SERVING`,
what SGLang's added module carries).  Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

#: record statuses of a (method, point)
TIMED = "timed"
FAILED_CHECK = "failed_check"
NOT_RUNNABLE = "not_runnable"
ERROR = "error"
#: a method's first record: it is being set up (the last one seen names a crash's method)
STARTING = "starting"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Serving:
    """How SGLang runs a method (one of ROUTES; None: a bench-only variant no policy names)
    and what a serving process needs for it (:mod:`.decision`): one of these importable
    names ("module" or "module:attribute"); these dtypes, world sizes, GPU majors (empty:
    any); at most this many tokens (None: any); whether CUDA graphs take it."""

    route: str | None = None
    needs_any: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    world_sizes: tuple[int, ...] = ()
    gpu_majors: tuple[int, ...] = ()
    max_tokens: int | None = None
    in_graphs: bool = True


#: How SGLang runs a method a policy names: what SGLang's side switches on (docs/policy.md
#: describes each)
ROUTES = ("fused", "pcie_ipc", "b12x", "sglang_dispatch")

#: per method (in :data:`METHODS`' order), what SGLang's added module needs of it
SERVING: dict[str, Serving] = {
    "nccl_rmsnorm": Serving(route="sglang_dispatch"),
    "nccl_tuned_rmsnorm": Serving(),
    "fused_oneshot": Serving(),
    "fused_twoshot": Serving(),
    "fused_auto": Serving(route="fused", needs_any=("flashinfer.comm:trtllm_allreduce_fusion",),
                          dtypes=("bf16", "fp16")),
    "pcie_ipc_rmsnorm": Serving(route="pcie_ipc",
                                needs_any=("flashinfer.comm:PcieIpcAllReduceWorkspace",),
                                dtypes=("bf16",), world_sizes=(2, 4, 8)),
    "custom_vllm_rmsnorm": Serving(),
    "custom_sglang_rmsnorm": Serving(route="sglang_dispatch"),
    "b12x_fused": Serving(route="b12x", needs_any=("flashinfer.experimental.b12x",),
                          dtypes=("bf16",), gpu_majors=(12,), max_tokens=36),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodSpec:
    """One method: its name in reports and policies, what it does, what it runs on."""

    name: str
    label: str
    #: environment its rank group needs (NCCL reads its tuning at init: own group)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: the FlashInfer module the bench's module step builds for it (besides comm and norm)
    module: str | None = None

    @property
    def route(self) -> str | None:
        return SERVING[self.name].route


#: NCCL settings for small messages from the facts file (SM12x PCIe boxes): the LL
#: protocol over a ring, the lowest-latency pair for messages of a few KB to ~100 KB.
NCCL_TUNED_ENV: Mapping[str, str] = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec(name="nccl_rmsnorm", label="NCCL all-reduce + fused_add_rmsnorm (defaults)"),
    MethodSpec(name="nccl_tuned_rmsnorm",
               label="NCCL all-reduce (NCCL_PROTO=LL, NCCL_ALGO=Ring) + fused_add_rmsnorm",
               env=NCCL_TUNED_ENV),
    MethodSpec(name="fused_oneshot", label="our fused kernel, one-shot (Lamport)"),
    MethodSpec(name="fused_twoshot", label="our fused kernel, two-shot"),
    MethodSpec(name="fused_auto", label="our fused kernel, FlashInfer's one/two-shot choice"),
    MethodSpec(name="pcie_ipc_rmsnorm",
               label="FlashInfer pcie_ipc all-reduce + fused_add_rmsnorm", module="pcie_ipc"),
    MethodSpec(name="custom_vllm_rmsnorm",
               label="FlashInfer's vLLM custom all-reduce + fused_add_rmsnorm", module="vllm"),
    MethodSpec(name="custom_sglang_rmsnorm",
               label="SGLang's custom all-reduce (sgl_kernel) + fused_add_rmsnorm"),
    MethodSpec(name="b12x_fused", label="b12x PCIe one-shot all-reduce + add + RMSNorm"),
)}

#: what SGLang runs where nothing else can: its own unfused dispatch, always usable
UNFUSED = "nccl_rmsnorm"
