"""The legacy custom all-reduce on a FlashInfer that dropped its Python wrapper (0.7.4)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from sm120fork.gpu.core import worker as rank


def test_legacy_workspace_sizes_are_flashinfers_own_formula_rounded_to_2_mib() -> None:
    sizes = rank.legacy_workspace_sizes(2, 16, 4608)
    mib2 = 1 << 21
    assert len(sizes) == 7
    assert all(s % mib2 == 0 for s in sizes)
    assert sizes[0] == sizes[1] >= 2 * 16 * 4608 * 4
    assert sizes[2] == sizes[3] == mib2  # (24 + 1) flags of 4 bytes per rank, twice: tiny
    assert sizes[4] == sizes[5] == sizes[6] >= 2 * 16 * 2 * 4608 * 2
    # the lamport buffer grows with the square of the world size
    assert rank.legacy_workspace_sizes(8, 16, 7168)[4] >= 8 * 16 * 8 * 7168 * 2


def test_the_wrapper_is_used_where_flashinfer_has_it() -> None:
    def wrapper(*_: Any) -> None:
        return None

    fc = types.SimpleNamespace(trtllm_custom_all_reduce=wrapper)
    assert rank.legacy_custom_all_reduce(fc) is wrapper


def test_without_the_wrapper_the_comm_modules_entry_point_is_called(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def entry(*_: Any) -> None:
        return None

    loaded = types.SimpleNamespace(trtllm_custom_all_reduce=entry)
    spec = types.SimpleNamespace(build_and_load=lambda: loaded)
    jit = types.ModuleType("flashinfer.jit.comm")
    jit.gen_trtllm_comm_module = lambda: spec  # type: ignore[attr-defined]
    for name in ("flashinfer", "flashinfer.jit"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "flashinfer.jit.comm", jit)
    assert rank.legacy_custom_all_reduce(types.SimpleNamespace()) is entry
