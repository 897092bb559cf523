"""Multicast safety: the environment every rank gets and the workspace backend policy.

FlashInfer 0.6.7.post3's ``create_allreduce_fusion_workspace(backend="auto")`` picks the
MNNVL backend whenever it is offered, and MNNVL creates CUDA multicast objects
(``cuMulticastCreate``), which can take every GPU of a shared host out of service.  So
the harness always asks for ``backend="trtllm"`` and refuses the other two unless the
user states, with a flag, that their machine supports multicast.
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

SAFE_BACKEND = "trtllm"
MULTICAST_BACKENDS = ("auto", "mnnvl")
ALLOW_MULTICAST_FLAG = "--i-know-this-machine-supports-multicast"


def check_backend(backend: str, *, allow_multicast: bool) -> str:
    """Return ``backend`` if the harness may ask FlashInfer for it, else raise."""
    if backend == SAFE_BACKEND:
        return backend
    if backend in MULTICAST_BACKENDS:
        if allow_multicast:
            return backend
        raise ConfigError(
            f'workspace backend "{backend}" may create CUDA multicast objects',
            where="--backend",
            fix=f'use "{SAFE_BACKEND}", or pass {ALLOW_MULTICAST_FLAG} on a machine '
            "you own that supports multicast",
        )
    raise ConfigError(
        f'unknown workspace backend "{backend}"', where="--backend",
        fix=f'use "{SAFE_BACKEND}"',
    )


def rank_environment(base: Mapping[str, str], extra: Mapping[str, str] | None = None,
                     ) -> dict[str, str]:
    """``base`` + ``extra`` with the multicast switches forced off (they win)."""
    env = dict(base)
    if extra:
        env.update(extra)
    env.update(MULTICAST_OFF_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    return env
