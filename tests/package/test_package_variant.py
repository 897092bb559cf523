"""Test-only variants: series + test series, built under .forks/, never published."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from sm120fork.errors import ConfigError
from sm120fork.package.wheel import build_test_variant
from sm120fork.resolved import ResolvedStack

from conftest import make_patch, write_series
from helpers_ws import make_demo


@pytest.mark.slow
def test_a_test_variant_carries_the_series_and_the_test_patch(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    test_dir = demo.series_dir("lib").with_name("lib-test")
    # stacked on the real series' commits (make_patch continues the same branch)
    patch = make_patch(demo.lib.repo, test_dir, "TEST override the answer", {
        "demo_lib/__init__.py": ("return [9, 10, 12]", "return [9, 10, 12, 99]")},
        "demo_lib/__init__.py: return [9, 10, 12, 99]")
    write_series(test_dir, [patch.name])
    wheel = build_test_variant(ResolvedStack.named(demo.ws, None), project_key="lib",
                               name="probe")
    assert wheel.name.startswith("demo_lib-1.2.3+")
    assert ".probe-py3" in wheel.name
    assert wheel.is_relative_to(demo.ws.state_dir / "test-variants")
    with zipfile.ZipFile(wheel) as zf:
        code = zf.read("demo_lib/__init__.py").decode()
        kernel = zf.read("demo_lib/kernel.cuh").decode()
    assert "return [9, 10, 12, 99]" in code
    assert "// SM12x: guard removed" in kernel  # the real series is under it
    assert not (demo.ws.root / "wheels").exists() or not any(
        p.name == wheel.name for p in (demo.ws.root / "wheels").rglob("*.whl"))


def test_a_test_variant_name_is_checked(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    with pytest.raises(ConfigError, match="test variant name"):
        build_test_variant(ResolvedStack.named(demo.ws, None), project_key="lib",
                           name="Bad-Name")
