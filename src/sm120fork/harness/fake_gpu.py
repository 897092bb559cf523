"""The fake-GPU machinery every layout's probe shares (and the layer harness's CPU mode);
``python -m sm120fork.harness.fake_gpu FILE`` runs an upstream test file as ``__main__`` on
a CPU machine, as upstream's CI does.

Only the GPU query is faked, GPU-only packages are permissive stubs, the modules under
test are imported for real; a probe prints one ``RESULT`` (:func:`emit`).  Imports nothing
of ``sm120fork`` but the stdlib-only wire: it runs beside the tree under test.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import runpy
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sm120fork.util import wire

#: Packages that only exist for (or only load on) a CUDA machine.
GPU_ONLY_PACKAGES: tuple[str, ...] = ("sgl_kernel", "flashinfer", "triton", "torchvision")

#: Imported by upstream's test utilities for helpers a unit test never calls: stubbed.
TEST_UTILITY_PACKAGES = ("datasets",)

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

Observation = dict[str, object]


def _stub_attr(owner: str, attr: str) -> Any:
    """A capitalised name stands for a class (isinstance and subclassing work)."""
    if attr.startswith("__"):  # absent: Python's machinery asks for them
        raise AttributeError(attr)
    name = f"{owner}.{attr}"
    if name in NO_DRIVER:
        raise RuntimeError(f"{name}: no GPU driver in the probe")
    if attr[:1].isupper():
        return _stub_class(owner, attr)
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


@functools.cache
def _stub_class(owner: str, attr: str) -> type:
    return type(attr, (_StubInstance,), {"__module__": owner})


class _Anything:
    """Any attribute of a stubbed package: callable, a decorator, a base class."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
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


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve a ``_StubModule`` for every module under ``packages``."""

    def __init__(self, packages: Sequence[str] = GPU_ONLY_PACKAGES) -> None:
        self.packages = tuple(packages)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.packages:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        setattr(module, "__version__", "0.0.0+stub")  # noqa: B010
        setattr(module, "__getattr__", functools.partial(_stub_attr, spec.name))  # noqa: B010
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _module(name: str) -> Any:
    """Import by name: torch and sglang are untyped here and live only in the probe's env."""
    return importlib.import_module(name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run ``then(module)`` once top-level module ``name`` is imported, if it ever is."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is not None:
            run = loader.exec_module

            def exec_module(module: types.ModuleType) -> None:
                run(module)
                self.then(module)
            loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def fake_gpu(capability: tuple[int, int] | None, cuda_version: str = "12.9", *,
             lazy: bool = False) -> None:
    """Make torch report one CUDA GPU of ``capability`` (None: a plain CPU machine) and CUDA
    ``cuda_version``; ``lazy``: only once something imports torch."""
    sys.meta_path.insert(0, _StubFinder())
    if lazy and "torch" not in sys.modules:
        sys.meta_path.insert(0, _AfterImport(
            "torch", lambda torch: _fake_torch(torch, capability, cuda_version)))
        return
    _fake_torch(_module("torch"), capability, cuda_version)


def _fake_torch(torch: Any, capability: tuple[int, int] | None, cuda_version: str) -> None:
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


class Records(logging.Handler):
    """The records of logger ``name`` at ``level`` and above, from now on; as a context
    manager, until its end."""

    def __init__(self, name: str, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.lines: list[str] = []
        self.logger = logging.getLogger(name)
        self.old_level = self.logger.level
        self.logger.addHandler(self)
        if level < logging.WARNING:
            self.logger.setLevel(level)

    def __enter__(self) -> Records:
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.old_level)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


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


def start_probe(capability: Sequence[int] | None, cuda_version: str = "12.9", *,
                lazy: bool = False) -> None:
    """What every probe process does first: no caller's SGLang settings or policy file
    steer the decisions; fake the GPU; log warnings."""
    for name in [name for name in os.environ if name.startswith("SGLANG_")]:
        del os.environ[name]
    # nor an all-reduce policy the user's bench left in their home (S1/S2, G2/G3 read it)
    os.environ["SGLANG_SM120_ALLREDUCE_POLICY"] = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "no-such-policy.json")
    fake_gpu((int(capability[0]), int(capability[1])) if capability else None,
             cuda_version=cuda_version, lazy=lazy)
    logging.basicConfig(level=logging.WARNING)


def emit(results: list[Observation]) -> int:
    """The probe's one result message (``layouts.results.run_probe`` reads it)."""
    wire.say("RESULT", results)
    return 0


def run_upstream_test(path: str) -> int:
    """``path`` as ``__main__``, GPU-only and test utility packages stubbed and the caller's
    ``SGLANG_*`` settings dropped; its exit status."""
    for name in [name for name in os.environ if name.startswith("SGLANG_")]:
        del os.environ[name]
    fake_gpu(None)
    sys.meta_path.insert(0, _StubFinder(TEST_UTILITY_PACKAGES))
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(run_upstream_test(*sys.argv[1:]))
