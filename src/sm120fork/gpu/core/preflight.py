"""Before a GPU run: has this Python a torch that sees a CUDA GPU?  Asked of a child process
(this one never imports torch) before anything is resolved or built."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys

from sm120fork.errors import CommandError, NoGpuError
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
