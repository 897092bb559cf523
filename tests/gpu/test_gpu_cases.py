"""The correctness matrix: thresholds covered, keys stable, crash-prone cases last."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from sm120fork.errors import ConfigError
from sm120fork.gpu.core import cases as m
from sm120fork.util import typed


def test_full_matrix_straddles_every_threshold() -> None:
    full = m.full_matrix([2, 4, 8])
    tokens = {c.tokens for c in full if c.api != m.CUSTOM_API}
    assert {1, 2, 4, 8, 15, 16, 17, 32, 64, 127, 128, 129, 512, 1024, 2048} <= tokens
    assert {c.hidden for c in full} == {2048, 4096, 7168, 8192}
    assert {c.dtype for c in full} == {"bf16", "fp16"}
    assert {c.strategy for c in full if c.api != m.CUSTOM_API} == {"oneshot", "twoshot", "auto"}
    assert {c.pdl for c in full} == {False, True}
    assert {c.pattern for c in full} == set(m.PATTERN_CODES)
    assert {c.api for c in full} == set(m.APIS)
    lamport = [c for c in full if c.lamport]
    assert {c.world_size for c in lamport} == {2, 4, 8}
    assert max(c.tokens for c in lamport) == 16
    # the controls on the other side of the lamport threshold are there too
    assert any(c.api == m.CUSTOM_API and c.tokens == 17 for c in full)


def test_quick_is_a_subset_with_every_api_and_lamport_cases() -> None:
    full = {c.key for c in m.full_matrix([2, 4])}
    quick = m.quick_matrix([2, 4])
    assert {c.key for c in quick} <= full
    assert {c.api for c in quick} == set(m.APIS)
    assert any(c.lamport for c in quick)
    assert len(quick) < len(full) / 20


def test_order_and_phases_run_the_custom_all_reduce_first() -> None:
    quick = m.quick_matrix([4, 2])
    sizes = [c.world_size for c in quick]
    assert sizes == sorted(sizes)
    for ws in (2, 4):
        batch = [c for c in quick if c.world_size == ws]
        n_custom = sum(c.api == m.CUSTOM_API for c in batch)
        assert all(c.api == m.CUSTOM_API for c in batch[:n_custom])
    batches = m.phases(quick)
    assert [(b[0].world_size, b[0].api == m.CUSTOM_API) for b in batches] == [
        (2, True), (4, True), (2, False), (4, False)]
    assert sum(len(b) for b in batches) == len(quick)
    assert all(len({c.world_size for c in b}) == 1 for b in batches)


def test_keys_and_seeds_are_stable_and_unique() -> None:
    case = m.Case(world_size=2, api="fusion_unified", pattern="ar_rmsnorm", tokens=16,
                  hidden=7168, dtype="bf16", strategy="auto", pdl=True)
    assert case.key == "fusion_unified/ar_rmsnorm/ws2/t16/h7168/bf16/auto/pdl1"
    assert case.seed == m.Case(**dataclasses.asdict(case)).seed
    full = m.full_matrix([2])
    assert len({c.key for c in full}) == len(full)
    assert len({c.seed for c in full}) > 0.99 * len(full)


def test_skip_reasons() -> None:
    base = m.Case(world_size=4, api="fusion_legacy", pattern="ar_rmsnorm", tokens=4,
                  hidden=4096, dtype="bf16", strategy="twoshot", pdl=False)

    def case(**kw: Any) -> m.Case:
        return dataclasses.replace(base, **kw)

    assert "twoshot" in (m.skip_reason(case(), (9, 0)) or "")
    assert m.skip_reason(case(tokens=5), (9, 0)) is None
    assert "FP4" in (m.skip_reason(case(tokens=16, pattern="ar_rmsnorm_fp4"), (9, 0)) or "")
    assert m.skip_reason(case(tokens=16, pattern="ar_rmsnorm_fp4"), (12, 0)) is None
    assert "FP8" in (m.skip_reason(case(tokens=16, pattern="ar_rmsnorm_fp8"), (8, 0)) or "")


def test_bad_case_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown api"):
        m.Case(world_size=2, api="nccl", pattern="ar_rmsnorm", tokens=1, hidden=1,
               dtype="bf16", strategy="auto", pdl=False)


def test_select_filters() -> None:
    quick = m.quick_matrix([2])
    only = m.select(quick, apis=[m.CUSTOM_API], max_cases=3)
    assert len(only) == 3
    assert all(c.api == m.CUSTOM_API for c in only)
    lamport = m.select(quick, apis=[m.CUSTOM_API], tokens=[1, 16])
    assert lamport
    assert all(c.lamport for c in lamport)


def test_bench_plan_round_trips() -> None:
    plan = m.bench_plan(2, quick=False)
    assert plan.tokens[0] == 1
    assert plan.tokens[-1] == 512  # issue 22: tokens 1-512, hidden 4096/6144/7168
    assert 3 in plan.tokens
    assert set(plan.hidden) == {7168, 6144, 4096}
    spec = json.loads(json.dumps(dataclasses.asdict(plan)))  # as the bench's spec file holds it
    assert typed.read(m.BenchPlan, spec, "the bench spec: bench") == plan


def test_hidden_runs_the_selected_cases_at_sizes_the_matrix_lacks() -> None:
    quick = m.quick_matrix([2])
    picked = m.select(quick, apis=[m.CUSTOM_API], tokens=[1, 16], hidden=[4608, 5376])
    assert {c.hidden for c in picked} == {4608, 5376}
    assert {c.tokens for c in picked} == {1, 16}
    assert all(c.lamport for c in picked)
    # each selected case once per size, no duplicates of the matrix's own two sizes
    once = m.select(quick, apis=[m.CUSTOM_API], tokens=[1, 16])
    assert len(picked) == 2 * len({dataclasses.replace(c, hidden=1) for c in once})
    assert len({c.key for c in picked}) == len(picked)
