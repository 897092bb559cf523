"""The front door: which Python the build runs on, and where session requirements live."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _noxfile() -> ModuleType:
    """Loaded once: nox registers each session when the file runs."""
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_runs_on_a_machine_that_has_only_python_3_12() -> None:
    nf = _noxfile()
    only_312 = {"python3.12": "/usr/bin/python3.12"}.get
    assert nf.first_python((3, 12), only_312) == "3.12"  # nox itself on 3.12
    assert nf.first_python((3, 10), only_312) == "3.12"  # nox on an older Python
    assert nf.first_python((3, 13), only_312) == "3.13"
    running = (sys.version_info.major, sys.version_info.minor)
    assert nf.build.python == nf.first_python(running)


def test_session_requirements_come_from_dependency_groups() -> None:
    nf = _noxfile()
    test = nf.groups("test")
    assert "matplotlib==3.10.8" in test
    assert "torch==2.13.0" in test  # through the included sglang-probe and proof groups
    assert "triton==3.9.0" in nf.groups("proof")
    assert set(test) <= set(nf.groups("lint"))
    assert not list((ROOT / "src" / "sm120fork").glob("*requirements*.txt"))
    assert not (ROOT / "tests" / "requirements.txt").exists()
