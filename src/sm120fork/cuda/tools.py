"""The CUDA binary tools the toolkit runs (cuobjdump, nvdisasm, c++filt), on ``PATH`` or in
the pip packages of the interpreter that runs them (NVIDIA's or triton's copies)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120fork.cuda.toolkit import locate_nvcc
from sm120fork.errors import ConfigError, ToolkitError, VerifyError
from sm120fork.util import proc

log = logging.getLogger("sm120fork")

PROBE_MARK = "@@sm120fork-probe@@"

#: Every probe script's first lines: ``fake_flashinfer(root)`` stubs the packages
#: ``flashinfer`` and ``flashinfer.jit`` of the folder ``root``, so flashinfer/jit imports
#: without flashinfer/__init__.py, which would pull in every kernel wrapper and its needs.
_PRELUDE = r"""
import importlib, json, sys, types
from pathlib import Path

def fake_flashinfer(root):
    for name in ("flashinfer", "flashinfer.jit"):
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = module
"""

_SYS_PATH_PROBE = "print(sys.argv[1] + json.dumps(sys.path))"
#: Where pip puts a CUDA binary tool: NVIDIA's packages, then triton's copies.
_PIP_TOOLS = ("nvidia/cu*/bin/{}", "triton/backends/nvidia/bin/{}")


def _tool(name: str, paths: Sequence[str], patterns: Sequence[str] = _PIP_TOOLS) -> Path | None:
    """``name`` on PATH, else the first ``name`` pip installed in a folder of ``paths`` (an
    interpreter's sys.path)."""
    if on_path := shutil.which(name):
        return Path(on_path)
    return next((hit for entry in paths for pattern in patterns
                 for hit in sorted(Path(entry or ".").glob(pattern.format(name)))), None)


def probe(python: str | os.PathLike[str], script: str, *args: str | os.PathLike[str],
          what: str, where: str | None = None, error: type[ToolkitError] = VerifyError,
          mark: str = PROBE_MARK, **run: Any) -> Any:
    """Run the prelude and ``script`` in ``python`` (``mark`` its last argument, ``run`` to
    proc.run): the JSON after ``mark`` on the last stdout line with it, else ``error``."""
    out = proc.run([python, "-c", _PRELUDE + script, *args, mark], quiet=True, **run)
    payload = next((line.removeprefix(mark) for line in reversed(out.stdout.splitlines())
                    if line.startswith(mark)), None)
    if payload is None:
        raise error(f"{what} printed no result", where=where,
                    detail=(out.stdout + out.stderr)[-3000:])
    return json.loads(payload)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tools:
    """The programs the proof runs; ``None`` where one is missing and its check degrades."""

    python: Path
    nvcc: Path
    nvcc_version: str
    cuobjdump: Path | None
    nvdisasm: Path | None

    @property
    def can_disassemble(self) -> bool:
        return self.cuobjdump is not None and self.nvdisasm is not None


def require_tools_in_ci(tools: Tools) -> None:
    """On CI (``CI=true``) a missing disassembler is an error, not a degraded check."""
    if os.environ.get("CI", "").lower() == "true" and not tools.can_disassemble:
        raise VerifyError("cuobjdump/nvdisasm not found and CI=true",
                          where=str(tools.python),
                          fix="pip install --group proof (pyproject.toml)")


def find_tools(python: str | os.PathLike[str] | None = None) -> Tools:
    """Locate nvcc, c++filt and the disassemblers (on PATH or in the probe's packages)."""
    interpreter = Path(python) if python else Path(sys.executable)
    nvcc = locate_nvcc()
    if nvcc is None:
        raise VerifyError("nvcc not found (CUDA_HOME, PATH, /usr/local/cuda)",
                          fix="install the CUDA toolkit (nvcc >= 12.9 for sm_120a/sm_120f)")
    paths: list[str] = probe(interpreter, _SYS_PATH_PROBE, what=f"{interpreter}")
    tools = Tools(python=interpreter, nvcc=nvcc.path, nvcc_version=nvcc.version_text,
                  cuobjdump=_tool("cuobjdump", paths), nvdisasm=_tool("nvdisasm", paths))
    if not tools.can_disassemble:
        log.warning("cuobjdump/nvdisasm not found: PDL instructions will be 'not checked' "
                    "(pip install --group proof into %s)", interpreter)
    return tools


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Mangled -> demangled C++ names (identity where c++filt is unavailable)."""
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None or not names:
        return {n: n for n in names}
    out = proc.run([cxxfilt], quiet=True, input="\n".join(names) + "\n").stdout.splitlines()
    if len(out) != len(names):
        raise VerifyError("c++filt returned a different number of names", where=cxxfilt)
    return dict(zip(names, out, strict=True))


def find_cuobjdump() -> Path:
    """cuobjdump on PATH, else the one pip's ``nvidia-cuda-cuobjdump`` installs."""
    hit = _tool("cuobjdump", sys.path, _PIP_TOOLS[:1])
    if hit is not None:
        return hit
    raise ConfigError("cuobjdump not found", fix="pip install nvidia-cuda-cuobjdump "
                      "(or put the CUDA toolkit's bin/ on PATH)")
