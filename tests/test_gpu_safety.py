"""The multicast switches: forced in every rank, and "auto"/"mnnvl" refused by default."""

from __future__ import annotations

import pytest

from sm120fork.errors import ConfigError
from sm120fork.gpu import safety


def test_trtllm_is_the_only_backend_by_default() -> None:
    assert safety.check_backend("trtllm", allow_multicast=False) == "trtllm"
    for backend in ("auto", "mnnvl"):
        with pytest.raises(ConfigError, match="multicast"):
            safety.check_backend(backend, allow_multicast=False)
        assert safety.check_backend(backend, allow_multicast=True) == backend
    with pytest.raises(ConfigError, match="unknown"):
        safety.check_backend("nccl", allow_multicast=True)


def test_rank_environment_forces_multicast_off() -> None:
    env = safety.rank_environment({"NCCL_NVLS_ENABLE": "1", "KEEP": "x"},
                                  {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"})
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["KEEP"] == "x"
    assert env["PYTHONUNBUFFERED"] == "1"
