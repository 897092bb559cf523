"""The rank process (gpu/ab/correctness.py, gpu/core/worker.py and what they run) on a CPU
machine: what it refuses, the protocol lines it prints, and how a failing case is reported
and ends the rank or not."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sm120fork.gpu.ab import correctness
from sm120fork.gpu.ab import run as ab_run
from sm120fork.gpu.ab.results import CaseResult, Check
from sm120fork.gpu.bench import run as bench_run
from sm120fork.gpu.core import worker as rank
from sm120fork.gpu.core.cases import Case, RankSpec, quick_matrix
from sm120fork.gpu.core.safety import MULTICAST_OFF_ENV
from sm120fork.util import typed, wire

SRC = Path(__file__).resolve().parents[2] / "src"


def _worker(tmp_path: Path, spec: dict[str, Any], env: dict[str, str],
            ) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return subprocess.run([sys.executable, "-m", "sm120fork.gpu.ab.correctness", str(path), "0"],
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**env, "PYTHONPATH": str(SRC), "CUDA_VISIBLE_DEVICES": ""})


def _spec(tmp_path: Path) -> dict[str, Any]:
    return {"mode": "test", "world_size": 2, "store": str(tmp_path / "store"),
            "max_tokens": 16, "max_hidden": 1024, "cases": []}


def test_a_rank_refuses_to_run_with_multicast_switched_on(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in MULTICAST_OFF_ENV}
    done = _worker(tmp_path, _spec(tmp_path), env)
    assert done.returncode == 1
    assert "refusing to run: NCCL_NVLS_ENABLE must be 0 in every rank" in done.stderr


def test_a_rank_without_a_gpu_says_fatal_and_exits_at_once(tmp_path: Path) -> None:
    done = _worker(tmp_path, _spec(tmp_path), {**os.environ, **MULTICAST_OFF_ENV})
    assert done.returncode == rank.EXIT_FATAL
    lines = [wire.decode(line) for line in done.stdout.splitlines()]
    assert wire.Message("FATAL", "no CUDA device visible to the rank") in lines


@pytest.mark.parametrize("run_group", [ab_run.run_cases, bench_run.run_group])
def test_each_harness_starts_its_own_rank_entry_which_serves_the_module_build_too(
        tmp_path: Path, run_group: Any) -> None:
    argv = inspect.signature(run_group).parameters["worker"].default
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"mode": "compile", "modules": []}))
    done = subprocess.run([*argv, str(spec)], capture_output=True, text=True, check=False,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr
    assert wire.Message("DONE", None) in [wire.decode(line) for line in done.stdout.splitlines()]


def test_a_rank_entry_refuses_another_harness_s_spec_before_it_joins_the_group(
        tmp_path: Path) -> None:
    done = _worker(tmp_path, {**_spec(tmp_path), "mode": "bench"},
                   {**os.environ, **MULTICAST_OFF_ENV})
    assert done.returncode == 1
    assert "ValueError: unknown mode bench" in done.stderr
    assert "FATAL" not in done.stdout  # it never set up a rank


class _Rank:
    rank = 0
    capability = (9, 0)
    shared = False

    def __init__(self) -> None:
        self.barriers = 0

    def barrier(self) -> None:
        self.barriers += 1


def _lines(out: str) -> list[tuple[str, Any]]:
    return [(m.tag, m.data) for m in map(wire.decode, out.splitlines()) if m]


def _cases() -> list[Case]:
    cases = [c for c in quick_matrix([2]) if c.strategy != "twoshot"]
    return [cases[0], cases[1]]


def test_a_failing_case_is_reported_and_the_next_one_runs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = _cases()

    def run_case(rk: Any, case: Case) -> CaseResult:
        if case is first:
            raise RuntimeError("workspace creation failed earlier: no IPC")
        return CaseResult(key=case.key, rank=rk.rank, status="pass")

    monkeypatch.setattr(correctness, "run_case", run_case)
    rk = _Rank()
    correctness.run_tests(rk, [first, second])  # type: ignore[arg-type]
    lines = _lines(capsys.readouterr().out)
    assert [t for t, _ in lines] == ["START", "RESULT", "START", "RESULT"]
    failed, passed = lines[1][1], lines[3][1]
    assert (failed["key"], failed["status"], failed["failure"]) == (first.key, "fail", "error")
    assert failed["reason"] == "RuntimeError: workspace creation failed earlier: no IPC"
    assert typed.read(CaseResult, passed, "RESULT") == CaseResult(key=second.key, rank=0,
                                                                  status="pass")
    assert rk.barriers == 2  # the ranks stay in step after a failed case


def test_a_cuda_error_ends_the_rank_so_the_launcher_restarts_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = _cases()

    def run_case(rk: Any, case: Case) -> CaseResult:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def hard_exit(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(correctness, "run_case", run_case)
    monkeypatch.setattr(correctness, "hard_exit", hard_exit)
    with pytest.raises(SystemExit) as exited:
        correctness.run_tests(_Rank(), [first, second])  # type: ignore[arg-type]
    assert exited.value.code == rank.EXIT_CUDA_ERROR
    lines = _lines(capsys.readouterr().out)
    assert [t for t, _ in lines] == ["START", "RESULT"]  # the second case never starts
    assert lines[1][1]["status"] == "fail"


def test_a_case_this_gpu_cannot_run_is_a_skip_with_its_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    fp4 = next(c for c in quick_matrix([2]) if c.pattern.endswith("fp4"))
    correctness.run_tests(_Rank(), [fp4])  # type: ignore[arg-type]
    (_, start), (_, result) = _lines(capsys.readouterr().out)
    assert start == fp4.key
    assert result["status"] == "skip"
    assert result["reason"].startswith("FP4 quantization needs sm_100 or newer (GPU is sm_90)")


def test_legacy_fusion_on_ranks_sharing_a_gpu_is_a_skip_where_its_workspace_is_torch_symm(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """FlashInfer 0.7.x's legacy fusion workspace is torch symmetric memory, which refuses ranks
    sharing one GPU: those cases are skipped with that reason (the H200 run of 0.7.4 failed all
    of them, patched and unpatched alike), not failed; on a GPU per rank, or with a FlashInfer
    whose workspace is not torch symmetric memory, they run."""
    legacy = next(c for c in quick_matrix([2])
                  if c.api == "fusion_legacy" and c.strategy != "twoshot")
    unified = next(c for c in quick_matrix([2])
                   if c.api == "fusion_unified" and c.strategy != "twoshot")
    ran: list[str] = []

    def run_case(rk: Any, case: Case) -> CaseResult:
        ran.append(case.key)
        return CaseResult(key=case.key, rank=rk.rank, status="pass")

    monkeypatch.setattr(correctness, "run_case", run_case)
    trtllm_ar = type(sys)("flashinfer.comm.trtllm_ar")
    trtllm_ar._alloc_symm_buffer_bytes = lambda *a: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer.comm.trtllm_ar", trtllm_ar)
    shared = _Rank()
    shared.shared = True
    correctness.run_tests(shared, [legacy, unified])  # type: ignore[arg-type]
    results = [r for t, r in _lines(capsys.readouterr().out) if t == "RESULT"]
    assert results[0]["status"] == "skip"
    assert "torch symmetric memory" in results[0]["reason"]
    assert ran == [unified.key]
    separate = _Rank()
    separate.shared = False
    correctness.run_tests(separate, [legacy])  # type: ignore[arg-type]
    assert ran == [unified.key, legacy.key]
    del trtllm_ar._alloc_symm_buffer_bytes
    correctness.run_tests(shared, [legacy])  # type: ignore[arg-type]
    assert ran == [unified.key, legacy.key, legacy.key]


def test_a_group_s_spec_and_a_rank_s_result_reach_the_other_side_as_they_left() -> None:
    """Parent -> spec file -> rank, and rank -> wire -> parent: each message is serialized
    once at its edge and read back to the same typed value."""
    cases = tuple(_cases())
    spec = RankSpec(mode="test", world_size=2, store="/tmp/store", backend="trtllm",
                    allow_multicast=False, max_tokens=16, max_hidden=1024,
                    custom_max_tokens=1, cases=cases)
    on_disk = json.loads(json.dumps(dataclasses.asdict(spec)))
    assert on_disk["mode"] == "test"
    assert on_disk["allow_multicast"] is False  # Rank reads the group's keys from it too
    assert typed.read(RankSpec, on_disk, "spec") == spec
    result = CaseResult(key=cases[0].key, case=cases[0], rank=1, status="fail",
                        failure="wrong result", reason="norm_out: rel L2 0.5 > 0.015",
                        checks=(Check(output="norm_out", stage="eager", ok=False, kind="bf16",
                                      rel_l2=0.5, max_abs=2.0, reason="rel L2 0.5 > 0.015"),),
                        failing_ranks=(1,), log_tail={"rank1": ("a", "b")})
    line = wire.encode("RESULT", dataclasses.asdict(result))
    message = wire.decode(line)
    assert message is not None
    assert typed.read(CaseResult, message.data, "RESULT") == result


# --- issue 42: a worker sees the packages its venv sees ----------------------------------

def _site(root: Path, dist: str, version: str, module: str) -> Path:
    """A site folder holding one distribution that installs ``cuda/<module>`` (``cuda``
    itself a namespace: no ``__init__.py``, as cuda-bindings and cuda-tile ship it)."""
    (root / "cuda" / module).mkdir(parents=True)
    (root / "cuda" / module / "__init__.py").write_text("")
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("cuda\n")
    return root


def test_a_variants_worker_sees_a_namespace_split_across_two_sites(tmp_path: Path) -> None:
    """The H100 kit run: cuda-tile in the kit's venv, cuda-bindings in the box's; the
    worker's path put the toolkit's package folder (with its own ``cuda``) first."""
    from sm120fork.gpu.core.variants import Variant

    kit = _site(tmp_path / "kit-site", "cuda-tile", "1.7.0", "tile")
    box = _site(tmp_path / "box-site", "cuda-bindings", "13.3.1", "bindings")
    variant = Variant(name="patched", wheel=None, sha256=None, site=tmp_path / "variant",
                      jit_base=tmp_path / "jit")
    env = variant.env({**os.environ, "PYTHONPATH": os.pathsep.join([str(kit), str(box)])})
    done = subprocess.run([sys.executable, "-c", "import cuda.bindings, cuda.tile, sm120fork"],
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_module_that_cannot_import_says_which_package_and_where_it_looked(
        tmp_path: Path) -> None:
    box = _site(tmp_path / "box-site", "cuda-bindings", "13.3.1", "bindings")
    shadow = tmp_path / "shadow"
    (shadow / "cuda").mkdir(parents=True)
    (shadow / "cuda" / "__init__.py").write_text("")
    code = ("from sm120fork.gpu.core.worker import import_failure\n"
            "try:\n    import cuda.bindings\n"
            "except ImportError as exc:\n    print(import_failure(exc))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(box), str(SRC)])}
    said = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert said == (f"ModuleNotFoundError: No module named 'cuda.bindings' ('cuda' resolved "
                    f"to ['{shadow / 'cuda'}']; installed that provide 'cuda': cuda-bindings "
                    f"13.3.1 in {box})")


def test_a_module_build_that_cannot_import_says_where_it_looked(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sm120fork.gpu.core import worker as probe

    def load() -> Any:
        import sm120fork_no_such_package  # type: ignore[import-not-found]  # noqa: F401
    monkeypatch.setattr(probe, "environment", dict)
    monkeypatch.setattr(probe, "MODULES", {"vllm": (load, False)})
    probe.run_compile(["vllm"])
    assert ("No module named 'sm120fork_no_such_package' ('sm120fork_no_such_package' is in "
            "none of sys.path [") in capsys.readouterr().out


def test_the_bench_plan_a_group_is_given_is_the_plan_its_ranks_measure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan crosses the process edge in the group's spec file, read back typed."""
    from sm120fork.gpu.bench import timing as bench_worker
    from sm120fork.gpu.core.cases import bench_plan
    from sm120fork.gpu.core.variants import Timeouts, Variant
    from sm120fork.util import proc

    plan = dataclasses.replace(bench_plan(4, quick=True, tokens=[1, 3]), floors=False)
    specs: list[dict[str, Any]] = []

    def run_ranks(_worker: Any, spec: Any, world: int, *_a: Any) -> Any:
        on_disk = json.dumps(spec(tmp_path / "store"), default=dataclasses.asdict)
        specs.append({**json.loads(on_disk), "ranks": world})
        return proc.GroupOutcome(ok=True)

    monkeypatch.setattr(bench_run, "run_ranks", run_ranks)
    variant = Variant(name="patched", wheel=None, sha256=None, site=None, jit_base=tmp_path)
    bench_run.run_group(plan, variant, tmp_path, methods=["fused_auto"], timeouts=Timeouts())
    measured: list[tuple[object, list[str]]] = []
    monkeypatch.setattr(bench_worker, "measure",
                        lambda _rk, got, methods: measured.append((got, methods)))
    bench_worker.run(_Rank(), specs[0])  # type: ignore[arg-type]
    assert measured == [(plan, ["fused_auto"])]
    assert (specs[0]["ranks"], specs[0]["max_tokens"], specs[0]["max_hidden"]) == (
        4, 3, max(plan.hidden))


def test_each_module_s_loader_imports_its_builder_by_name_when_called() -> None:
    from sm120fork.gpu.core import worker as probe

    assert set(probe.MODULES) == {"comm", "norm", "pcie_ipc", "vllm"}
    assert probe._builder("os", "getcwd")() is os.getcwd
    load = probe._builder("sm120fork_no_such_package.comm", "get_module")  # imports nothing yet
    with pytest.raises(ModuleNotFoundError, match="sm120fork_no_such_package"):
        load()
