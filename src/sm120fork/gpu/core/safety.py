"""Multicast safety: the environment every rank gets and the workspace backend policy.

FlashInfer 0.6.7.post3 picks the NVLink-fabric backend when offered, whose multicast
memory can take a shared host's GPUs out of service: the harness asks for trtllm and
refuses the others without a flag, and even then on a host that switches multicast off
or says it is shared.
"""

from __future__ import annotations

from collections.abc import Mapping

from sm120fork.errors import ConfigError

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


def multicast_forbidden_by(environ: Mapping[str, str]) -> str | None:
    """The variable by which this host forbids multicast, or None."""
    if environ.get(SHARED_HOST_ENV) == "1":
        return f"{SHARED_HOST_ENV}=1"
    for name, off in MULTICAST_OFF_ENV.items():
        if environ.get(name) == off:
            return f"{name}={off}"
    return None


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
    forbidden = multicast_forbidden_by(host_environ) if host_environ is not None else None
    if forbidden:
        raise ConfigError(
            f"{risk}, and this host forbids multicast ({forbidden})", where="--backend",
            fix=f'use "{SAFE_BACKEND}"; shared GPU machines never run multicast code')
    if not allow_multicast:
        raise ConfigError(risk, where="--backend", fix=f'use "{SAFE_BACKEND}", or pass '
                          f"{ALLOW_MULTICAST_FLAG} on a machine you own that supports multicast")
    return backend


def rank_environment(base: Mapping[str, str], extra: Mapping[str, str] | None = None,
                     ) -> dict[str, str]:
    """``base`` + ``extra`` with the multicast switches forced off (they win)."""
    return {**base, **(extra or {}), **MULTICAST_OFF_ENV, "PYTHONUNBUFFERED": "1"}
