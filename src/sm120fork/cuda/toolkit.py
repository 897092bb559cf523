"""The one nvcc locator, in FlashInfer's JIT's order (``CUDA_HOME``, ``PATH``,
``/usr/local/cuda``; the AOT build also takes pip's ``nvidia-cuda-nvcc``).  Stdlib only:
the doctor runs it on serving boxes."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import CommandError, ConfigError
from ..util import proc

_RELEASE = re.compile(r"release (\d+)\.(\d+)")
DEFAULT_HOME = Path("/usr/local/cuda")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Nvcc:
    """A located nvcc and the toolkit it belongs to."""

    path: Path
    #: The toolkit root (holds bin/nvcc, include/, lib64/).
    home: Path
    #: ``"13.0"``.
    version: str
    #: The last line of ``nvcc --version`` (part of the proof's cache keys).
    version_text: str
    #: Where it was found: ``CUDA_HOME``, ``PATH``, ``/usr/local/cuda`` or ``pip``.
    found_in: str


def _version(nvcc: Path) -> tuple[str, str] | None:
    try:
        out = proc.run([nvcc, "--version"], quiet=True, check=False, timeout=60).stdout
    except CommandError:  # not runnable, or hung
        return None
    match = _RELEASE.search(out)
    if not match:
        return None
    return f"{match.group(1)}.{match.group(2)}", out.strip().splitlines()[-1]


def _home_of(nvcc: Path) -> Path:
    """The toolkit root of an nvcc on PATH (``/usr/local/bin/nvcc`` may be a wrapper)."""
    try:
        out = proc.run([nvcc, "--dryrun", "-x", "cu", "-E", os.devnull], quiet=True,
                       check=False, timeout=60)
        lines = (out.stdout + out.stderr).splitlines()
    except CommandError:
        lines = []
    for line in lines:
        if "TOP=" in line:
            top = Path(line.split("TOP=", 1)[1].strip()).resolve()
            if (top / "bin" / "nvcc").is_file():
                return top
    return nvcc.resolve().parents[1]


def _pip_homes(python_paths: Sequence[str]) -> list[Path]:
    return [candidate for entry in python_paths
            for candidate in sorted(Path(entry or ".").glob("nvidia/cu[0-9]*"))
            if (candidate / "bin" / "nvcc").is_file()]


def locate_nvcc(*, environ: Mapping[str, str] | None = None, pip: bool = False,
                python_paths: Sequence[str] | None = None) -> Nvcc | None:
    """The first nvcc that runs and says its release, in FlashInfer's JIT's order; else None."""
    env = os.environ if environ is None else environ
    found: list[tuple[Path, Path | None, str]] = []   # nvcc, its root (None: ask it), where
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        found.append((Path(home) / "bin" / "nvcc", Path(home), "CUDA_HOME"))
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        found.append((Path(on_path), None, "PATH"))
    found.append((DEFAULT_HOME / "bin" / "nvcc", DEFAULT_HOME, str(DEFAULT_HOME)))
    if pip:
        found += [(h / "bin" / "nvcc", h, "pip")
                  for h in _pip_homes(sys.path if python_paths is None else python_paths)]
    for path, root, where in found:
        version = _version(path) if path.is_file() else None
        if version is not None:
            return Nvcc(path=path, home=root if root is not None else _home_of(path),
                        version=version[0], version_text=version[1], found_in=where)
    return None


def require_nvcc(*, pip: bool = False, fix: str | None = None) -> Nvcc:
    """:func:`locate_nvcc`, or a ``ConfigError`` naming every place it looked."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and not (Path(home) / "bin" / "nvcc").is_file():
        raise ConfigError("CUDA_HOME has no bin/nvcc", where=home,
                          fix="point CUDA_HOME at a CUDA toolkit or unset it")
    found = locate_nvcc(pip=pip)
    if found is None:
        places = "CUDA_HOME, PATH, /usr/local/cuda" + (", pip's nvidia-cuda-nvcc" if pip else "")
        raise ConfigError(f"nvcc not found (looked in {places})",
                          fix=fix or "install the CUDA toolkit (nvcc >= 12.9 for SM12x) or "
                                     "set CUDA_HOME")
    return found
