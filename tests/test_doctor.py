"""``doctor`` on the CPU: the machine's answers stubbed, the judgement real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sm120fork.doctor import checks, cli, ipc
from sm120fork.doctor.cuda import WRITE_KERNEL_PTX, CudaError, Device, Driver
from sm120fork.errors import DoctorError

TESTS = Path(__file__).resolve().parent
SM120 = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def gpus(n: int, capability: tuple[int, int] = (12, 0), p2p: bool = True) -> checks.GpuFacts:
    devices = tuple(Device(index=i, name=SM120, capability=capability, multicast=False)
                    for i in range(n))
    return checks.GpuFacts(driver="13.0", devices=devices,
                           p2p=tuple(tuple(a == b or p2p for b in range(n)) for a in range(n)))


def all_ok(devices: Sequence[int]) -> list[ipc.PairResult]:
    return [ipc.PairResult(writer=w, owner=o, writer_gpu=devices[w], owner_gpu=devices[o],
                           ok=True, detail="1024 words written and read back")
            for w in range(len(devices)) for o in range(len(devices)) if w != o]


HOOKS = [{"hook": "G1 sglang.srt.layers.flashinfer_comm_fusion._resolve_backend",
          "state": "applied", "why": ""}]
DECISIONS = {"model": "Qwen3MoeForCausalLM", "decisions": [
    {"tp": 2, "fusion": True, "backend": "auto", "line": "Auto-enabling ... on SM12x: TP2"},
    {"tp": 4, "fusion": False, "backend": None, "line": "not auto-enabled: only TP2"},
    {"tp": 8, "fusion": False, "backend": None, "line": "not auto-enabled: only TP2"}]}


def fake_flashinfer(root: Path, majors: str = "[9, 10, 12]") -> Path:
    pkg = root / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "jit" / "comm.py").write_text(
        "def gen_trtllm_comm_module():\n"
        f"    nvcc_flags = ctx.get_nvcc_flags_list(supported_major_versions={majors})\n")
    return pkg


def probes(tmp_path: Path, **overrides: Any) -> checks.Probes:
    versions = {"sglang": "0.5.23", "flashinfer-python": "0.7.2",
                checks.PLUGIN_DISTRIBUTION: "0.5.23+sm120.1"}
    versions.update(overrides.pop("versions", {}))
    flashinfer = fake_flashinfer(tmp_path / "site", overrides.pop("majors", "[9, 10, 12]"))
    base = checks.Probes(
        gpus=lambda: gpus(2), runtime=lambda: "13.0", peer_writes=all_ok,
        installed=versions.get,
        package_dir=lambda name: flashinfer if name == "flashinfer" else None,
        plugin=lambda: HOOKS, nvcc=lambda: ("/usr/local/cuda/bin/nvcc", "13.0"),
        decisions=lambda: DECISIONS, environ={}, home=tmp_path / "home")
    return replace(base, **overrides)


def test_healthy_sm120_box_has_no_blocker(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([], probes(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "GPU 1: NVIDIA RTX PRO 6000 Blackwell Server Edition, compute capability 12.0, " \
           "multicast no" in out
    assert "GPU 0 -> GPU 1: ok: 1024 words written and read back" in out
    assert "plugin sm120fork-sglang-plugin 0.5.23+sm120.1: active" in out
    assert "nvcc 13.0 (/usr/local/cuda/bin/nvcc) can JIT it for 12.x" in out
    assert "--tp 2 (Qwen3MoeForCausalLM): fusion on: Auto-enabling ... on SM12x: TP2" in out
    assert "--tp 4 (Qwen3MoeForCausalLM): fusion off" in out
    assert "[blockers] 0" in out


def test_each_blocker_is_one_line_and_the_exit_code_is_doctors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def dropped(devices: Sequence[int]) -> list[ipc.PairResult]:
        return [replace(r, ok=False, detail="1024 of 1024 words missing")
                if r.writer_gpu == 1 else r for r in all_ok(devices)]

    sick = probes(tmp_path, gpus=lambda: gpus(2, p2p=False), peer_writes=dropped,
                  versions={checks.PLUGIN_DISTRIBUTION: None}, nvcc=lambda: None)
    assert cli.main(["--json"], sick) == DoctorError.exit_code
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    blockers = report["blockers"]
    assert sum(b.startswith("P2P: GPU") for b in blockers) == 2
    assert [b for b in blockers if b.startswith("peer writes:")] == [
        "peer writes: GPU 1 -> GPU 0 did not arrive (1024 of 1024 words missing); the fused "
        "kernel would hang or compute garbage here: check IOMMU/ACS settings, or keep "
        "fusion off"]
    assert any(b.startswith("sglang: stock sglang 0.5.23 refuses SM12x") for b in blockers)
    assert any("no prebuilt trtllm_comm and no nvcc" in b for b in blockers)


def test_one_gpu_tests_ipc_between_two_processes(tmp_path: Path) -> None:
    seen: list[Sequence[int]] = []

    def record(devices: Sequence[int]) -> list[ipc.PairResult]:
        seen.append(devices)
        return all_ok(devices)

    report = checks.examine(probes(tmp_path, gpus=lambda: gpus(1), peer_writes=record))
    assert seen == [[0, 0]]
    assert ("peer writes", "one GPU: testing CUDA IPC between two processes on GPU 0") \
        in report.lines
    assert ("peer writes", "process 0 -> process 1 on GPU 0: ok: 1024 words written and "
            "read back") in report.lines


def test_stock_sglang_installed_over_ours(tmp_path: Path) -> None:
    report = checks.examine(probes(tmp_path, versions={
        "flashinfer-python": "0.6.7.post3+sm120.1", "sglang": "0.5.10.post1",
        checks.PLUGIN_DISTRIBUTION: None}))
    assert report.sections["packages"]["sglang_kind"] == "stock, installed over ours"
    assert any(b.startswith("sglang: pip install -U sglang replaced our patched build")
               for b in report.blockers)


def test_plugin_that_cannot_apply_and_a_whitelist_that_skips_it(tmp_path: Path) -> None:
    hooks = [{"hook": "G1 x._resolve_backend", "state": "not applied",
              "why": "installed sglang 0.5.24; this plugin is for 0.5.23"}]
    report = checks.examine(probes(tmp_path, plugin=lambda: hooks,
                                   environ={"SGLANG_PLUGINS": "other"}))
    assert report.sections["packages"]["plugin_active"] is False
    assert any("1 hook(s) cannot apply" in b and "0.5.24" in b for b in report.blockers)
    assert any("SGLANG_PLUGINS=other does not list 'sm120fork'" in b for b in report.blockers)
    assert ("environment", "overrides in force: SGLANG_PLUGINS=other") in report.lines


def test_comm_module_stock_jit_refuses_and_old_nvcc(tmp_path: Path) -> None:
    refusing = checks.examine(probes(tmp_path, majors="[9, 10]"))
    assert any("JIT refuses compute capability 12.x (it builds [9, 10])" in b
               for b in refusing.blockers)
    old = checks.examine(probes(tmp_path / "b", nvcc=lambda: ("/opt/nvcc", "12.8")))
    assert any("nvcc 12.8 cannot JIT for compute capability 12.x" in b for b in old.blockers)


def test_prebuilt_comm_module_is_found(tmp_path: Path) -> None:
    cached = tmp_path / "home" / ".cache" / "flashinfer" / "0.7.2" / "120f" / "cached_ops"
    (cached / "trtllm_comm").mkdir(parents=True)
    (cached / "trtllm_comm" / "trtllm_comm.so").write_bytes(b"\x7fELF")
    report = checks.examine(probes(tmp_path, nvcc=lambda: None))
    assert report.blockers == []
    assert any(t.startswith("prebuilt trtllm_comm found") for _, t in report.lines)


def test_h200_without_sglang_reports_facts_only(tmp_path: Path) -> None:
    report = checks.examine(probes(tmp_path, gpus=lambda: gpus(1, capability=(9, 0)),
                                   versions={"sglang": None, "flashinfer-python": None,
                                             checks.PLUGIN_DISTRIBUTION: None}))
    assert report.blockers == []  # not an SM12x box: SGLang's own gates are fine here
    assert report.sections["decisions"] is None


def test_no_driver_is_a_blocker_on_this_machine() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(CudaError, match="no NVIDIA driver"):
        Driver()
    report = checks.examine(checks.Probes(decisions=lambda: {"error": "skipped"}))
    assert report.blockers[0].startswith("GPUs: no NVIDIA driver")


@pytest.mark.parametrize(("env", "expect_ok"), [({}, True), ({"FAKE_IPC_DROP": "1"}, False)])
def test_ipc_probe_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            env: dict[str, str], expect_ok: bool) -> None:
    monkeypatch.setenv("FAKE_IPC_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *sys.path]))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    results = ipc.probe([0, 1, 2], timeout=60, module="fake_ipc_child")
    assert len(results) == 6
    by_pair = {(r.writer_gpu, r.owner_gpu): r for r in results}
    for (w, _), r in by_pair.items():
        assert r.ok is (expect_ok or w != 1), r
    if not expect_ok:
        assert by_pair[(1, 0)].detail == "1024 of 1024 words missing"


def test_ipc_probe_bounds_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_IPC_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *sys.path]))
    monkeypatch.setenv("FAKE_IPC_HANG", "1")
    results = ipc.probe([0, 1], timeout=3, module="fake_ipc_child")
    assert {r.ok for r in results} == {False}
    assert all("no answer within 3s" in r.detail for r in results)


@pytest.mark.nvcc
def test_peer_write_kernel_assembles_for_sm90_and_sm12x(tmp_path: Path) -> None:
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not Path(ptxas).exists():
        pytest.skip("no ptxas")
    source = tmp_path / "k.ptx"
    source.write_bytes(WRITE_KERNEL_PTX)
    for arch in ("sm_90", "sm_120", "sm_121"):
        subprocess.run([ptxas, f"-arch={arch}", str(source), "-o", str(tmp_path / arch)],
                       check=True)


def test_toolkit_verb_runs_outside_a_checkout(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-m", "sm120fork", "doctor", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, check=False,
                          timeout=300)
    report = json.loads(done.stdout)
    assert done.returncode == (DoctorError.exit_code if report["blockers"] else 0)
    assert set(report) >= {"gpus", "packages", "comm_module", "environment", "blockers"}


@pytest.mark.parametrize("drop", [False, True])
def test_driver_glue_against_a_host_memory_libcuda(tmp_path: Path, drop: bool) -> None:
    """The ctypes calls (argument packing, the IPC handle by value, kernel parameters)
    against a stand-in libcuda.so.1 whose "kernel" does the PTX's stores on the host."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"),
                    str(TESTS / "fake_libcuda.c")], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), FAKE_CUDA_MAP=str(tmp_path / "map"),
               PYTHONPATH=os.pathsep.join(sys.path))
    if drop:
        env["FAKE_DROP"] = "1"
    try:
        done = subprocess.run([sys.executable, "-m", "sm120fork.doctor", "--json"], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
    finally:
        for line in (tmp_path / "map").read_text().splitlines():
            Path(line.split()[1]).unlink(missing_ok=True)
    report = json.loads(done.stdout)
    assert [d["name"] for d in report["gpus"]["devices"]] == ["Fake GPU 0", "Fake GPU 1"]
    assert report["gpus"]["p2p"] == [[True, True], [True, True]]
    details = {(p["writer_gpu"], p["owner_gpu"]): p["detail"] for p in report["peer_writes"]}
    expected = "1024 of 1024 words missing" if drop else "1024 words written and read back"
    assert details == {(0, 1): expected, (1, 0): expected}
