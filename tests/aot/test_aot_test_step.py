"""The AOT wheel's test step on this host (issue 18): the index its shim requirement lives
on, and a failing step that keeps the built wheel instead of losing an hour of nvcc."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from sm120fork.aot import pipeline
from sm120fork.errors import BuildError

SHIM = "flashinfer-jit-cache==0.7.2+cu130"


def _wheel(folder: Path, name: str, requires: list[str]) -> Path:
    path = folder / name
    dist = "-".join(name.split("-")[:2]) + ".dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: x\nVersion: 1\n"
                         + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_a_wheel_that_requires_the_shim_is_installed_with_flashinfers_index(
        tmp_path: Path) -> None:
    provider = _wheel(tmp_path, "sm120fork_flashinfer_aot-0.7.2+cu130-cp312-cp312-linux_x86_64"
                      ".whl", ["flashinfer-python==0.7.2", SHIM, "nvidia-cuda-runtime<14,>=13.0"])
    assert pipeline.install_index_args(provider) == [
        "--extra-index-url", "https://flashinfer.ai/whl/cu130"]
    ours = _wheel(tmp_path, "sm120fork_flashinfer_aot-0.6.7.post3.sm120.1.cu130-cp312-cp312-"
                  "linux_x86_64.whl", ["flashinfer-python==0.6.7.post3+sm120.1"])
    assert pipeline.install_index_args(ours) == []


def test_a_failing_test_step_keeps_the_wheel_and_says_what_it_needs(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "sm120fork_flashinfer_aot-0.7.2+cu130-cp312-cp312-linux_x86_64.whl",
                   [SHIM])
    plan = pipeline.HostPlan(identifier="cp312-manylinux_x86_64", before_build="", frontend="build",
                         frontend_args=(), repair="", before_test="",
                         test_command="python -c pass", environment={})
    out = tmp_path / "out"
    (tmp_path / "work").mkdir()
    env = {**os.environ, "PIP_NO_INDEX": "1"}  # the shim is nowhere: no index, no network
    with pytest.raises(BuildError) as caught:
        pipeline.run_test_step(plan, wheel, out, env, {"project": tmp_path, "package": tmp_path},
                           tmp_path / "work")
    kept = out / "untested" / wheel.name
    assert kept.read_bytes() == wheel.read_bytes()
    error = caught.value
    assert error.what.startswith("the AOT wheel was built but its test step failed at "
                                 "installing the wheel (with --extra-index-url "
                                 "https://flashinfer.ai/whl/cu130): ")
    assert error.where == str(kept)
    assert "PIP_FIND_LINKS" in (error.fix or "")
    assert not list(out.glob("*.whl"))  # nothing published as if it had passed
