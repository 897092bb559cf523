"""A GPU session on a box without torch or without a GPU says so in one line, with its own
exit code, before it resolves, installs or builds anything."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from sm120fork.errors import NoGpuError


@pytest.mark.parametrize("argv", [
    ["test", "--quick", "--stack", "sglang-0.5.10"],
    ["bench", "--quick"],
    ["sglang-layer", "--stack", "sglang-0.5.10", "--out", "layer"],
])
def test_without_torch_a_gpu_verb_ends_in_one_line_and_its_own_exit_code(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sm120fork.gpu.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails: no torch here
    monkeypatch.chdir(tmp_path)  # nothing to resolve here: the check comes first
    assert main([*argv, "--work-dir", str(tmp_path / "work")]) == NoGpuError.exit_code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("error: no torch in Python ")
    assert "Traceback" not in err
    assert "internal error" not in err
    assert not (tmp_path / "work").exists()


def test_the_toolkit_command_line_and_the_session_say_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`nox -s gpu_test` runs `python -m sm120fork gpu test` (noxfile.py)."""
    from sm120fork.cli.main import main

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.chdir(tmp_path)
    assert main(["gpu", "test", "--stack", "sglang-0.5.10", "--quick"]) == 17
    assert "no torch in" in capsys.readouterr().err


def test_a_cpu_only_torch_is_no_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """The test environment's torch is the CPU build: the probe says so."""
    pytest.importorskip("torch")
    from sm120fork.gpu.core import safety as preflight

    with pytest.raises(NoGpuError, match=r"CPU-only build|sees no GPU"):
        preflight.require_gpu()


def test_the_exit_code_is_no_one_elses() -> None:
    from sm120fork import errors

    codes = {c.exit_code for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, errors.ToolkitError)
             and c is not NoGpuError}
    assert NoGpuError.exit_code not in codes | {errors.EXIT_INTERNAL, errors.EXIT_INTERRUPTED}


@pytest.mark.parametrize(("env", "how"), [
    ({"SM120FORK_COMMAND": "sh <kit sglang-0.5.10>/run gpu_test --quick"},
     "PYTHON=/path/to/python sh <kit sglang-0.5.10>/run gpu_test --quick"),
    ({"NOX_CURRENT_SESSION": "bench"}, "/path/to/python -m nox -s bench"),
    ({}, "/path/to/python -m sm120fork gpu ..."),
])
def test_the_way_to_a_cuda_torch_is_the_command_as_given(
        env: dict[str, str], how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kit's run was told to use nox's Python (python3 -m nox -s ...), which it never runs."""
    from sm120fork.gpu.core import safety as preflight

    for name in ("SM120FORK_COMMAND", "NOX_CURRENT_SESSION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(NoGpuError) as caught:
        preflight.require_gpu()
    assert caught.value.fix == (f"run it on a GPU box with the Python that has its CUDA "
                                f"torch: {how}; see docs/gpu.md")
