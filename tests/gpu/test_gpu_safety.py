"""The multicast switches: forced in every rank, and "auto"/"mnnvl" refused by default."""

from __future__ import annotations

import pytest

from sm120fork.errors import ConfigError
from sm120fork.gpu.core import safety


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


@pytest.mark.parametrize("host", [
    {"SM120FORK_SHARED_GPU_HOST": "1"},
    {"NCCL_NVLS_ENABLE": "0"},
    {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"},
    {"NVSHMEM_DISABLE_NVLS": "1"},
])
@pytest.mark.parametrize("backend", ["auto", "mnnvl"])
def test_shared_hosts_refuse_multicast_even_with_the_flag(host: dict[str, str],
                                                         backend: str) -> None:
    with pytest.raises(ConfigError, match="this host forbids multicast"):
        safety.check_backend(backend, allow_multicast=True, host_environ=host)
    assert safety.check_backend("trtllm", allow_multicast=False, host_environ=host) == "trtllm"
    # A host of the user's own, without those switches, may opt in with the flag.
    assert safety.check_backend(backend, allow_multicast=True, host_environ={}) == backend


def test_the_cli_refuses_multicast_on_a_shared_host(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from sm120fork.gpu.cli import main

    monkeypatch.setenv("SM120FORK_SHARED_GPU_HOST", "1")
    assert main(["test", "--backend", "auto", "--i-know-this-machine-supports-multicast",
                 "--quick"]) != 0
    captured = capsys.readouterr()
    assert "this host forbids multicast" in captured.out + captured.err
