"""Before a GPU run: has this Python a torch that sees a CUDA GPU (asked of a child process,
before anything is resolved or built), and multicast safety: the environment every rank
gets and the workspace backend policy.

FlashInfer 0.6.7.post3 picks the NVLink-fabric backend when offered, whose multicast
memory can take a shared host's GPUs out of service: the harness asks for trtllm and
refuses the others without a flag, and even then on a host that switches multicast off
or says it is shared.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from collections.abc import Mapping

from sm120fork.errors import CommandError, ConfigError, NoGpuError
from sm120fork.util import proc

_PROBE = ("import json, torch; n = torch.cuda.device_count() if torch.version.cuda else 0; "
          "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
          "'gpus': [torch.cuda.get_device_name(i) for i in range(n)]}))")

#: The command a kit's ``run`` was given (the kit's boot sets it; records name it).
COMMAND_ENV = "SM120FORK_COMMAND"


def _fix() -> str:
    """The command as it was given, with the Python that has a CUDA torch."""
    session = os.environ.get("NOX_CURRENT_SESSION")
    how = (f"PYTHON=/path/to/python {os.environ[COMMAND_ENV]}" if os.environ.get(COMMAND_ENV)
           else f"/path/to/python -m nox -s {session}" if session
           else "/path/to/python -m sm120fork gpu ...")
    return f"run it on a GPU box with the Python that has its CUDA torch: {how}; see docs/gpu.md"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuHost:
    """What the probe found: torch's version, its CUDA and the GPUs it sees."""

    torch: str
    cuda: str
    gpus: tuple[str, ...]


def _here() -> str:
    return f"Python {sys.version.split()[0]} ({sys.executable})"


def require_gpu(*, timeout: float = 300.0) -> GpuHost:
    """The GPUs this Python's torch sees; :class:`NoGpuError` when it sees none."""
    if importlib.util.find_spec("torch") is None:
        raise NoGpuError(f"no torch in {_here()}: the GPU harnesses need a CUDA build of "
                         "torch", fix=_fix())
    try:
        done = proc.run([sys.executable, "-c", _PROBE], check=False, quiet=True,
                        timeout=timeout)
    except CommandError as exc:
        raise NoGpuError(f"torch did not answer within {timeout:.0f} s in {_here()}",
                         fix=_fix()) from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        last = next((line for line in reversed((done.stderr or done.stdout).splitlines())
                     if line.strip()), f"exit code {done.returncode}")
        raise NoGpuError(f"torch does not import in {_here()}: {last.strip()}", fix=_fix())
    found = json.loads(lines[-1])
    if not found.get("cuda"):
        raise NoGpuError(f"torch {found.get('torch')} in {_here()} is a CPU-only build",
                         fix=_fix())
    if not found.get("gpus"):
        raise NoGpuError(f"torch {found['torch']} (CUDA {found['cuda']}) sees no GPU on this "
                         "machine", fix=_fix())
    return GpuHost(torch=str(found["torch"]), cuda=str(found["cuda"]),
                   gpus=tuple(found["gpus"]))


#: Set in every rank's environment, whatever the caller's environment says.
MULTICAST_OFF_ENV: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

SHARED_HOST_ENV = "SM120FORK_SHARED_GPU_HOST"
SAFE_BACKEND = "trtllm"
MULTICAST_BACKENDS = ("auto", "mnnvl")
ALLOW_MULTICAST_FLAG = "--i-know-this-machine-supports-multicast"


def check_backend(backend: str, *, allow_multicast: bool,
                  host_environ: Mapping[str, str] | None = None) -> str:
    """Return ``backend`` if the harness may ask FlashInfer for it, else raise;
    ``host_environ``: the caller's (the ranks, whose switches are forced off, pass None)."""
    if backend == SAFE_BACKEND:
        return backend
    if backend not in MULTICAST_BACKENDS:
        raise ConfigError(f'unknown workspace backend "{backend}"', where="--backend",
                          fix=f'use "{SAFE_BACKEND}"')
    risk = f'workspace backend "{backend}" may create CUDA multicast objects'
    host = host_environ or {}  # the variables by which this host forbids multicast:
    forbidden = [f"{name}={off}" for name, off in ((SHARED_HOST_ENV, "1"),
                                                   *MULTICAST_OFF_ENV.items())
                 if host.get(name) == off]
    if forbidden:
        raise ConfigError(
            f"{risk}, and this host forbids multicast ({forbidden[0]})", where="--backend",
            fix=f'use "{SAFE_BACKEND}"; shared GPU machines never run multicast code')
    if not allow_multicast:
        raise ConfigError(risk, where="--backend", fix=f'use "{SAFE_BACKEND}", or pass '
                          f"{ALLOW_MULTICAST_FLAG} on a machine you own that supports multicast")
    return backend


def rank_environment(base: Mapping[str, str], extra: Mapping[str, str] | None = None,
                     ) -> dict[str, str]:
    """``base`` + ``extra`` with the multicast switches forced off (they win)."""
    return {**base, **(extra or {}), **MULTICAST_OFF_ENV, "PYTHONUNBUFFERED": "1"}
