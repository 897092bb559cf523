"""The bench's method registry and driver, with fake adapters (no GPU, no FlashInfer)."""

from __future__ import annotations

from typing import Any

import pytest

from sm120fork.gpu import methods
from sm120fork.gpu.bench import run as bench_run
from sm120fork.gpu.bench import timing
from sm120fork.gpu.bench.timing import Point
from sm120fork.gpu.core.documents import BenchRecord, CheckVerdict


class FakeAdapter:
    def __init__(self, name: str, *, unavailable: str | None = None, ok: bool = True,
                 unsupported_at: int | None = None) -> None:
        self.name = name
        self._unavailable = unavailable
        self.ok = ok
        self.unsupported_at = unsupported_at
        self.checked: list[Point] = []
        self.timed: list[Point] = []

    def unavailable(self) -> str | None:
        return self._unavailable

    def unsupported(self, point: Point) -> str | None:
        return "too few tokens" if point.tokens == self.unsupported_at else None


def _run(adapters: list[FakeAdapter], points: list[Point],
         gather: Any = None) -> list[BenchRecord]:
    records: list[BenchRecord] = []

    def check(adapter: FakeAdapter, point: Point) -> tuple[bool, list[CheckVerdict]]:
        adapter.checked.append(point)
        return adapter.ok, [{"output": "norm", "ok": adapter.ok,
                             "reason": "" if adapter.ok else "rel L2 0.9 > 0.015"}]

    def time(adapter: FakeAdapter, point: Point) -> BenchRecord:
        adapter.timed.append(point)
        return {"median_us": float(point.tokens), "p90_us": point.tokens + 0.5}

    kwargs = {"gather": gather} if gather else {}
    timing.drive(adapters, points, check=check, time=time, emit=records.append, **kwargs)
    return records


def test_every_registered_method_has_an_adapter() -> None:
    from sm120fork.gpu.bench.timing import FACTORIES

    assert list(FACTORIES) == list(methods.METHODS)


def test_a_method_is_timed_only_after_its_check_passed() -> None:
    good = FakeAdapter("fused_auto")
    wrong = FakeAdapter("custom_vllm_rmsnorm", ok=False)
    absent = FakeAdapter("pcie_ipc_rmsnorm", unavailable="FlashInfer 0.6.7 has no pcie_ipc")
    points = [Point(1, 7168), Point(64, 7168)]
    records = _run([good, wrong, absent], points)
    assert good.timed == points
    assert wrong.checked == points
    assert wrong.timed == []
    assert absent.checked == []
    assert absent.timed == []
    by = {(r["method"], r.get("tokens")): r for r in records}
    assert by[("pcie_ipc_rmsnorm", None)]["status"] == methods.NOT_RUNNABLE
    assert "no pcie_ipc" in by[("pcie_ipc_rmsnorm", None)]["reason"]
    assert by[("custom_vllm_rmsnorm", 64)]["status"] == methods.FAILED_CHECK
    assert "median_us" not in by[("custom_vllm_rmsnorm", 64)]
    assert by[("fused_auto", 64)]["status"] == methods.TIMED
    assert by[("fused_auto", 64)]["rank_medians_us"] == [64.0]
    assert by[("fused_auto", 64)]["rank_p90_us"] == [64.5]


def test_an_unsupported_shape_is_reported_and_the_rest_still_run() -> None:
    twoshot = FakeAdapter("fused_twoshot", unsupported_at=1)
    records = _run([twoshot], [Point(1, 4096), Point(16, 4096)])
    assert [r["status"] for r in records if r["kind"] == "point"] == [
        methods.NOT_RUNNABLE, methods.TIMED]
    assert twoshot.checked == [Point(16, 4096)]


def test_every_rank_takes_the_same_branch() -> None:
    """Rank 1 cannot run the method: rank 0 (this one) must not check it alone."""
    adapter = FakeAdapter("nccl_rmsnorm")
    records = _run([adapter], [Point(1, 4096)],
                   gather=lambda own: [own, "no NCCL here"] if not isinstance(own, tuple)
                   else [own, own])
    assert records == [
        {"kind": "method", "method": "nccl_rmsnorm", "status": methods.STARTING},
        {"kind": "method", "method": "nccl_rmsnorm", "status": methods.NOT_RUNNABLE,
         "reason": "rank 1: no NCCL here"}]
    assert adapter.checked == []


def test_a_check_that_raises_is_a_failed_check_not_a_crash() -> None:
    adapter = FakeAdapter("fused_oneshot")
    records: list[BenchRecord] = []

    def boom(_a: Any, _p: Point) -> tuple[bool, list[CheckVerdict]]:
        raise RuntimeError("workspace says no")

    timing.drive([adapter], [Point(8, 4096)], check=boom,
                  time=lambda *_: pytest.fail("timed after a failed check"),
                  emit=records.append)
    assert records[-1]["status"] == methods.FAILED_CHECK
    assert "workspace says no" in records[-1]["reason"]


def test_tuned_nccl_runs_in_a_group_of_its_own() -> None:
    groups = bench_run.group_envs(bench_run.select(None))
    assert groups[()][:2] == ["nccl_rmsnorm", "fused_oneshot"]
    assert groups[(("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "LL"))] == ["nccl_tuned_rmsnorm"]
    assert bench_run.modules(["pcie_ipc_rmsnorm", "fused_auto", "custom_vllm_rmsnorm"]) == [
        "pcie_ipc", "vllm"]


def test_module_step_imports_in_the_main_thread_and_optional_failures_are_reported(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Threads importing one package at once saw half-initialised FlashInfer modules."""
    import threading

    from sm120fork.gpu.core import worker as probe

    seen: list[str] = []

    def loader(name: str, *, fail_import: bool = False, fail_build: bool = False) -> Any:
        def load() -> Any:
            main = threading.current_thread() is threading.main_thread()
            seen.append(f"import {name} main={main}")
            if fail_import:
                raise ImportError(f"no {name} here")

            def build() -> None:
                if fail_build:
                    raise RuntimeError(f"{name} did not build")
            return build
        return load

    monkeypatch.setattr(probe, "environment", dict)
    monkeypatch.setattr(probe, "MODULES", {
        "comm": (loader("comm"), True), "pcie_ipc": (loader("pcie_ipc", fail_import=True), False),
        "vllm": (loader("vllm", fail_build=True), False)})
    probe.run_compile(["comm", "pcie_ipc", "vllm"])
    assert seen == ["import comm main=True", "import pcie_ipc main=True", "import vllm main=True"]
    out = capsys.readouterr().out
    assert '"module": "pcie_ipc", "ok": false, "reason": "ImportError: no pcie_ipc here"' in out
    assert '"module": "vllm", "ok": false' in out
    assert '"module": "comm", "ok": true' in out
    monkeypatch.setattr(probe, "MODULES", {"comm": (loader("comm", fail_build=True), True)})
    with pytest.raises(RuntimeError, match="required modules failed"):
        probe.run_compile(["comm"])
