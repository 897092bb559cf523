"""The CUDA toolkit the AOT build compiles with: a system install or the pip packages.

A build machine has no driver, and not every toolkit ships ``lib64/stubs/libcuda.so`` or an
unversioned ``libcudart.so``: a link directory supplies them, through FlashInfer's own
``FLASHINFER_EXTRA_LDFLAGS``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from sm120fork.cuda.toolkit import require_nvcc
from sm120fork.errors import ConfigError
from sm120fork.util import proc

_STUB_SOURCE = "/* libcuda.so link stub: the real driver library is found at run time. */\n"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Toolchain:
    """``cuda_home`` holds ``bin/nvcc``; ``link_dir`` what the linker needs besides it."""

    cuda_home: Path
    nvcc: Path
    version: str
    version_text: str
    link_dir: Path
    source: str  # "system" or "pip"

    def env(self) -> dict[str, str]:
        """What FlashInfer's JIT reads to find and link with this toolkit."""
        lib_dirs = [d for d in (self.cuda_home / "lib64", self.cuda_home / "lib") if d.is_dir()]
        flags = [f"-L{d}" for d in (*lib_dirs, self.link_dir)]
        path = os.pathsep.join([str(self.cuda_home / "bin"), os.environ.get("PATH", "")])
        return {"CUDA_HOME": str(self.cuda_home), "PATH": path,
                "FLASHINFER_EXTRA_LDFLAGS": " ".join(flags)}


def prepare(link_dir: Path) -> Toolchain:
    """Locate the toolkit (the one nvcc locator, pip's ``nvidia-cuda-nvcc`` included) and
    fill ``link_dir`` with the stubs FlashInfer's link needs."""
    nvcc = require_nvcc(pip=True, fix="pip install -r aot/requirements-build.txt (the CUDA "
                        "toolchain from the package index) or install the CUDA toolkit")
    home, source = nvcc.home, "pip" if nvcc.found_in == "pip" else "system"
    link_dir.mkdir(parents=True, exist_ok=True)
    link_dir = link_dir.resolve()  # the link runs in the build's work folder
    has_cudart = any((home / lib / "libcudart.so").exists() for lib in ("lib64", "lib"))
    if not has_cudart:
        versioned = next((p for lib in ("lib64", "lib")
                          for p in sorted((home / lib).glob("libcudart.so.[0-9]*"))), None)
        if versioned is None:
            raise ConfigError("the CUDA toolkit has no libcudart.so", where=str(home),
                              fix="install nvidia-cuda-runtime of the same CUDA version")
        link = link_dir / "libcudart.so"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(versioned)
    has_driver = any((home / d / "libcuda.so").exists() for d in ("lib64/stubs", "lib/stubs"))
    if not has_driver and not (link_dir / "libcuda.so").exists():
        stub_c = link_dir / "libcuda_stub.c"
        stub_c.write_text(_STUB_SOURCE)
        cc = os.environ.get("CC", "cc")
        proc.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                  link_dir / "libcuda.so", stub_c], quiet=True)
    return Toolchain(cuda_home=home, nvcc=nvcc.path, version=nvcc.version,
                     version_text=nvcc.version_text, link_dir=link_dir, source=source)
