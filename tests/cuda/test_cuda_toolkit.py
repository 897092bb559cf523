"""The one nvcc locator (cuda/toolkit.py): FlashInfer's JIT's order, used by every stage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sm120fork.cuda import toolkit
from sm120fork.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "sm120fork"


def _nvcc(home: Path, release: str) -> Path:
    exe = home / "bin" / "nvcc"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                   f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n"
                   f"echo 'Build cuda_{release}.r{release}'\n")
    exe.chmod(0o755)
    return exe


@pytest.fixture
def no_default_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(toolkit, "DEFAULT_HOME", tmp_path / "no-usr-local-cuda")


@pytest.mark.usefixtures("no_default_home")
def test_cuda_home_wins_over_path_as_in_flashinfers_jit(tmp_path: Path) -> None:
    home = tmp_path / "cuda-13.0"
    _nvcc(home, "13.0")
    on_path = _nvcc(tmp_path / "other", "12.8").parent
    found = toolkit.locate_nvcc(environ={"CUDA_HOME": str(home), "PATH": str(on_path)})
    assert found is not None
    assert (found.path, found.home, found.version) == (home / "bin" / "nvcc", home, "13.0")
    assert found.found_in == "CUDA_HOME"
    assert found.version_text == "Build cuda_13.0.r13.0"


@pytest.mark.usefixtures("no_default_home")
def test_path_then_pip_only_when_asked(tmp_path: Path) -> None:
    on_path = _nvcc(tmp_path / "toolkit", "12.9").parent
    found = toolkit.locate_nvcc(environ={"PATH": str(on_path)})
    assert found is not None
    assert (found.found_in, found.version, found.home) == ("PATH", "12.9", tmp_path / "toolkit")
    site = tmp_path / "site"
    _nvcc(site / "nvidia" / "cu13", "13.0")
    assert toolkit.locate_nvcc(environ={"PATH": ""}, python_paths=[str(site)]) is None
    pip = toolkit.locate_nvcc(environ={"PATH": ""}, pip=True, python_paths=[str(site)])
    assert pip is not None
    assert (pip.found_in, pip.home) == ("pip", site / "nvidia" / "cu13")


def test_a_cuda_home_without_nvcc_is_named(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="CUDA_HOME has no bin/nvcc"):
        toolkit.require_nvcc()


@pytest.mark.usefixtures("no_default_home")
def test_no_nvcc_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ConfigError, match=r"nvcc not found \(looked in CUDA_HOME, PATH"):
        toolkit.require_nvcc()


def test_one_nvcc_locator() -> None:
    """verify, aot, gpu and the doctor find nvcc only through cuda/toolkit.py (the plugin
    wheel ships it with the doctor); the doctor's FlashInfer probe asks FlashInfer's own
    get_cuda_path() which toolkit its JIT uses, and locates nothing itself."""
    finders = re.compile(r"""which\(\s*["']nvcc["']|["']bin["']\s*/\s*["']nvcc["']|/bin/nvcc""")
    hits = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                  if finders.search(p.read_text(encoding="utf-8")))
    assert hits == ["cuda/toolkit.py", "doctor/flashinfer_probe.py"]
    probe = (SRC / "doctor" / "flashinfer_probe.py").read_text(encoding="utf-8")
    assert "cpp_ext.get_cuda_path()" in probe
