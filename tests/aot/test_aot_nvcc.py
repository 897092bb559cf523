"""A real (tiny) nvcc build: per-target times, the link stubs, and the empty-body check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sm120fork.aot import check as aot_check
from sm120fork.aot import compile as compile_mod

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

# `guarded` keeps its body on sm_90a only, as FlashInfer 0.6.7.post3's lamport kernel did
# (SM120-FACTS F3); `kept` has the same body everywhere.
KERNELS = r"""
#define BODY                                                                   \
  float acc = x[threadIdx.x];                                                  \
  _Pragma("unroll")                                                            \
  for (int i = 0; i < 64; ++i) { acc = acc * x[(threadIdx.x + i) % 32] + i; }  \
  x[threadIdx.x] = acc;
__global__ void kept(float* x) { BODY }
__global__ void guarded(float* x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1200
  BODY
#endif
}
extern "C" int host_side() { return 1; }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, compile_mod.Toolchain]:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    work = tmp_path_factory.mktemp("nvcc")
    tc = compile_mod.prepare(work / "link")
    (work / "k.cu").write_text(KERNELS)
    times = work / "time.csv"
    subprocess.run([tc.nvcc, "-c", "k.cu", "-o", "k.o", "--compiler-options=-fPIC",
                    "-gencode=arch=compute_90a,code=sm_90a",
                    "-gencode=arch=compute_120f,code=sm_120f", f"--time={times}"],
                   cwd=work, check=True)
    # Linked the way FlashInfer's JIT links a module, with the stub directory.
    subprocess.run(["c++", "k.o", "-shared", *tc.env()["FLASHINFER_EXTRA_LDFLAGS"].split(),
                    "-lcudart", "-lcuda", "-o", "k.so"], cwd=work, check=True)
    return work / "k.so", times, tc


def test_toolchain_has_what_flashinfers_link_line_needs(
        built: tuple[Path, Path, compile_mod.Toolchain]) -> None:
    so, _, tc = built
    assert tc.version.startswith(("12.", "13."))
    needed = subprocess.run(["readelf", "-d", str(so)], check=True, capture_output=True,
                            text=True).stdout
    assert "libcudart.so" in needed
    # -lcuda resolved against the stub, which carries the driver's soname (the linker drops
    # it again when, as here, no driver function is used).
    stub = subprocess.run(["readelf", "-d", str(tc.link_dir / "libcuda.so")], check=True,
                          capture_output=True, text=True).stdout
    assert "Library soname: [libcuda.so.1]" in stub


def test_nvcc_times_are_split_per_target(built: tuple[Path, Path, compile_mod.Toolchain]) -> None:
    _, times, _ = built
    phases = compile_mod.parse_nvcc_times(times.read_text())
    device = {p.target for p in phases if p.target}
    assert device == {"sm_90a", "sm_120f"}
    assert {p.phase for p in phases if p.target == "sm_120f"} >= {"cicc", "ptxas"}
    assert all(p.source == "k.cu" and p.seconds >= 0 for p in phases)
    assert any(not p.target and p.phase == "cudafe++" for p in phases)


def test_embedded_code_and_the_empty_body_check(
        built: tuple[Path, Path, compile_mod.Toolchain]) -> None:
    so, _, _ = built
    code = aot_check.embedded_code(so)
    by_target = {c.target: c for c in code}
    assert set(by_target) >= {"sm_90a"}
    other = next(c for c in code if c.target != "sm_90a")
    assert other.target.startswith("sm_120")
    assert set(by_target["sm_90a"].families.values()) == {"kept", "guarded"}
    (check,) = aot_check.check_module(code)
    assert not check.ok
    assert check.missing == ()
    assert [by_target["sm_90a"].families[name] for name in check.empty] == ["guarded"]
    rows = aot_check.family_rows(code)
    assert [row[0] for row in rows] == ["`guarded`", "`kept`"]


def test_the_link_folder_is_absolute_when_named_relative(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashInfer links in its build folder: a stub folder named relative to the caller's
    (``-L.device/...``) was not found there ("cannot find -lcuda")."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    monkeypatch.chdir(tmp_path)
    tc = compile_mod.prepare(Path("work") / "link")
    assert tc.link_dir == tmp_path / "work" / "link"
    assert f"-L{tmp_path / 'work' / 'link'}" in tc.env()["FLASHINFER_EXTRA_LDFLAGS"].split()
