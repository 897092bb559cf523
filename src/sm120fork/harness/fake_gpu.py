"""Probe of the real SGLang modules with a faked GPU, run by ``verify.sglang``.

Run as ``python -m sm120fork.harness.fake_gpu '<json request>'`` in a fresh interpreter
with ``PYTHONPATH=<tree>/python``, so one interpreter only ever sees one tree.  Only the
GPU query is faked (``torch.cuda`` capability, device name, peer access, and
``torch.version.cuda``), and packages that exist only for GPUs (``sgl_kernel``,
``flashinfer``, triton, torchvision) are replaced by permissive stubs in
``sys.modules``.  The modules under test (``server_args``, ``layers.communicator``,
``layers.layernorm``, ``layers.flashinfer_comm_fusion``) are imported for real.

The probe observes; ``verify.sglang`` judges.  It prints one line
``SM120FORK-PROBE-RESULT <json>``: a list of ``{"name", "observed", "detail"}``.
This file must not import ``sm120fork``: it runs beside the tree under test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

RESULT_MARKER = "SM120FORK-PROBE-RESULT "

#: Packages that only exist for (or only load on) a CUDA machine.
GPU_ONLY_PACKAGES = ("sgl_kernel", "flashinfer", "triton", "torchvision")

#: Stub attributes that raise, as the real ones do on a machine without a GPU driver.
NO_DRIVER = frozenset({"triton.runtime.driver"})

#: A device name per capability, as the sglang checks that look at names see it.
DEVICE_NAMES = {
    (8, 0): "NVIDIA A100-SXM4-80GB",
    (9, 0): "NVIDIA H200",
    (10, 0): "NVIDIA B200",
    (12, 0): "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    (12, 1): "NVIDIA GB10",
}

#: One of the model architectures upstream auto-enables the fusion for.
FUSION_MODEL_ARCH = "Qwen3MoeForCausalLM"
SM120_ENV = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
BATCH = 16

Observation = dict[str, Any]


def _stub_attr(owner: str, attr: str) -> Any:
    """A capitalised name stands for a class (isinstance and subclassing work)."""
    name = f"{owner}.{attr}"
    if name in NO_DRIVER:
        raise RuntimeError(f"{name}: no GPU driver in the probe")
    if attr[:1].isupper():
        if name not in _STUB_CLASSES:
            _STUB_CLASSES[name] = type(attr, (_StubInstance,), {"__module__": owner})
        return _STUB_CLASSES[name]
    return _Anything(name)


class _StubMeta(type):
    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{cls.__module__}.{cls.__qualname__}.{attr}")


class _StubInstance(metaclass=_StubMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._name = type(self).__qualname__

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{self._name}.{attr}")


_STUB_CLASSES: dict[str, type] = {}


class _Anything:
    """Any attribute of a stubbed package: callable, a decorator, a base class."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stub_attr(self._name, attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a bare decorator
        return _Anything(f"{self._name}()")

    def __getitem__(self, key: Any) -> _Anything:
        return _Anything(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stub_attr(self.__name__, attr)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve a ``_StubModule`` for every module under ``GPU_ONLY_PACKAGES``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in GPU_ONLY_PACKAGES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        setattr(module, "__version__", "0.0.0+stub")  # noqa: B010
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _module(name: str) -> Any:
    """Import by name: torch and sglang are untyped here and live only in the probe's env."""
    return importlib.import_module(name)


def fake_gpu(capability: tuple[int, int] | None, cuda_version: str = "12.9") -> None:
    """Make torch report one CUDA GPU of ``capability`` (None: a plain CPU machine).

    ``cuda_version`` is the CUDA version torch reports, and the one FlashInfer's stand-in says
    it compiles with (as FlashInfer does when it finds no nvcc).
    """
    sys.meta_path.insert(0, _StubFinder())
    torch = _module("torch")

    if capability is None:
        return
    name = DEVICE_NAMES.get(capability, f"NVIDIA sm_{capability[0]}{capability[1]}")
    torch.version.cuda = cuda_version
    version = _module("packaging.version").Version
    cpp_ext = _module("flashinfer.jit.cpp_ext")
    cpp_ext.get_cuda_version = lambda: version(torch.version.cuda)
    cuda: Any = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 8
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: capability
    cuda.get_device_name = lambda device=None: name
    cuda.can_device_access_peer = lambda device, peer: True


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))


@contextlib.contextmanager
def captured_logs(logger_name: str) -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger(logger_name)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@contextlib.contextmanager
def environ(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if old is not None:
            os.environ[name] = old


def _server_args(**overrides: Any) -> Any:
    """A ServerArgs with its field defaults, without running __post_init__."""
    ServerArgs = _module("sglang.srt.server_args").ServerArgs  # noqa: N806

    args: Any = ServerArgs.__new__(ServerArgs)
    for field in dataclasses.fields(ServerArgs):
        if field.default is not dataclasses.MISSING:
            setattr(args, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            setattr(args, field.name, field.default_factory())
    args.model_path = "sm120fork/probe-model"
    for key, value in overrides.items():
        setattr(args, key, value)
    hf_config = types.SimpleNamespace(architectures=[FUSION_MODEL_ARCH])
    args.get_model_config = lambda: types.SimpleNamespace(hf_config=hf_config)
    return args


def _decide(*, tp: int, explicit: bool, env: str | None, enforce_disable: bool) -> Observation:
    """Run upstream's model-specific adjustments, then ask the communicator gate."""
    sa = _module("sglang.srt.server_args")
    communicator = _module("sglang.srt.layers.communicator")

    args = _server_args(
        tp_size=tp,
        enable_flashinfer_allreduce_fusion=explicit,
        enforce_disable_flashinfer_allreduce_fusion=enforce_disable,
    )
    with environ(SM120_ENV, env), captured_logs("sglang.srt.server_args") as logs:
        try:
            sa.ServerArgs._handle_model_specific_adjustments(args)
        except ValueError as exc:
            return {"observed": "error", "detail": str(exc)}
    sa.set_global_server_args_for_scheduler(args)
    fused = bool(communicator.apply_flashinfer_allreduce_fusion(BATCH))
    flag = bool(args.enable_flashinfer_allreduce_fusion)
    notes = [msg for _, msg in logs.lines if "AllReduce Fusion" in msg or "allreduce" in msg]
    sm12x_lines = sum("on SM12x" in msg for _, msg in logs.lines)
    return {"observed": {"flag": flag, "fused": fused, "sm12x_lines": sm12x_lines},
            "detail": " | ".join(notes)}


def decision_scenarios() -> list[tuple[str, dict[str, Any]]]:
    """The decisions compared across capabilities and against upstream."""
    scenarios: list[tuple[str, dict[str, Any]]] = []
    for tp in (2, 4, 8):
        scenarios.append((f"explicit-flag tp{tp}", {"tp": tp, "explicit": True}))
    for tp in (1, 2, 4, 8):
        scenarios.append((f"auto tp{tp}", {"tp": tp}))
    for env in ("0", "off", "1", "on"):
        for tp in (2, 4, 8):
            scenarios.append((f"auto tp{tp} {SM120_ENV}={env}", {"tp": tp, "env": env}))
    scenarios.append((f"auto tp2 {SM120_ENV}=maybe", {"tp": 2, "env": "maybe"}))
    scenarios.append(("enforce-disable auto tp2", {"tp": 2, "enforce_disable": True}))
    scenarios.append(
        ("enforce-disable explicit tp4", {"tp": 4, "explicit": True, "enforce_disable": True})
    )
    return scenarios


def run_decisions() -> list[Observation]:
    results = []
    for name, params in decision_scenarios():
        observation = _decide(
            tp=params["tp"],
            explicit=params.get("explicit", False),
            env=params.get("env"),
            enforce_disable=params.get("enforce_disable", False),
        )
        results.append({"name": name, **observation})
    return results


def _reference_norm(x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any]:
    """All-reduced x + residual, then RMSNorm, in float64 on the CPU."""
    hidden = x.double() + residual.double()
    variance = hidden.pow(2).mean(dim=-1, keepdim=True)
    return hidden * (variance + eps).rsqrt() * weight.double(), hidden


def _fallback_case() -> Observation:
    """Fused norm whose fused call yields None: it must all-reduce, then add + norm.

    The all-reduce is a recorder that adds a fixed "peer" partial sum, as a second rank
    would; the fused call is replaced by one returning (None, None), as it does when the
    workspace is unavailable (the real one is a CUDA-only torch op).
    """
    torch = _module("torch")
    dist = _module("sglang.srt.distributed")
    fusion = _module("sglang.srt.layers.flashinfer_comm_fusion")
    RMSNorm = _module("sglang.srt.layers.layernorm").RMSNorm  # noqa: N806

    hidden, tokens, eps = 64, 3, 1e-6
    gen = torch.Generator().manual_seed(120)
    x = torch.randn(tokens, hidden, generator=gen)
    peer = torch.randn(tokens, hidden, generator=gen)
    residual = torch.randn(tokens, hidden, generator=gen)
    norm = RMSNorm(hidden, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=gen) + 0.5)
    # The CUDA kernel behind forward_cuda does not exist on a CPU; forward_native is
    # the same norm in plain torch.  The code under test is the fallback around it.
    norm._forward_method = norm.forward_native

    calls: list[tuple[int, ...]] = []
    tp_calls: list[tuple[int, ...]] = []

    def attention_all_reduce(tensor: Any) -> Any:
        calls.append(tuple(tensor.shape))
        return tensor + peer

    def tp_all_reduce(tensor: Any) -> Any:  # a TP group wider than the attention group
        tp_calls.append(tuple(tensor.shape))
        return tensor + 2 * peer

    patches: dict[Any, dict[str, Any]] = {
        dist: {
            "attention_tensor_model_parallel_all_reduce": attention_all_reduce,
            "tensor_model_parallel_all_reduce": tp_all_reduce,
            "get_attn_tensor_model_parallel_world_size": lambda: 2,
        },
        fusion: {"flashinfer_allreduce_residual_rmsnorm": lambda **_: (None, None)},
    }
    with torch.no_grad(), _patched(patches):
        out, residual_out = norm.forward_with_allreduce_fusion(
            x.clone(), residual.clone(), use_attn_tp_group=True
        )
        want_out, want_residual = _reference_norm(x + peer, residual, norm.weight, eps)
        out_ok = bool(torch.allclose(out.double(), want_out, rtol=1e-5, atol=1e-5))
        residual_ok = bool(
            torch.allclose(residual_out.double(), want_residual, rtol=1e-5, atol=1e-5)
        )
        max_err = float((out.double() - want_out).abs().max())
    return {
        "observed": {"attention_tp_all_reduce_calls": len(calls),
                     "tp_all_reduce_calls": len(tp_calls),
                     "matches_reference": out_ok and residual_ok},
        "detail": f"all-reduce over the attention TP group called with {calls}, over the "
                  f"TP group with {tp_calls}; max |norm - reference| = {max_err:.3g}",
    }


_MISSING = object()


@contextlib.contextmanager
def _patched(patches: dict[Any, dict[str, Any]]) -> Iterator[None]:
    """Set attributes for the duration; ones the tree lacks (upstream) are added."""
    saved = [
        (obj, key, getattr(obj, key, _MISSING)) for obj, attrs in patches.items() for key in attrs
    ]
    for obj, attrs in patches.items():
        for key, value in attrs.items():
            setattr(obj, key, value)
    try:
        yield
    finally:
        for obj, key, value in saved:
            if value is _MISSING:
                delattr(obj, key)
            else:
                setattr(obj, key, value)


def run_fallbacks() -> list[Observation]:
    """S3's all-reducing fallback (S4's failing closed runs on two ranks: gpu.sglang_layer)."""
    return [{"name": "fused call returns None", **_fallback_case()}]


SUITES: dict[str, Callable[[], list[Observation]]] = {
    "decisions": run_decisions,
    "fallbacks": run_fallbacks,
}


def start_probe(capability: Sequence[int] | None, cuda_version: str = "12.9") -> None:
    """What every probe process does first: drop the caller's SGLang settings (they must
    not steer the decisions), fake the GPU, log warnings."""
    for name in [name for name in os.environ if name.startswith("SGLANG_")]:
        del os.environ[name]
    fake_gpu((int(capability[0]), int(capability[1])) if capability else None,
             cuda_version=cuda_version)
    logging.basicConfig(level=logging.WARNING)


def emit(results: list[Observation]) -> int:
    """The probe's one result line (the caller reads the line after RESULT_MARKER)."""
    sys.stdout.write(RESULT_MARKER + json.dumps(results) + "\n")
    return 0


def main(argv: Sequence[str]) -> int:
    request = json.loads(argv[0])
    start_probe(request.get("capability"), cuda_version=str(request.get("cuda", "12.9")))
    return emit(SUITES[request["suite"]]())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
