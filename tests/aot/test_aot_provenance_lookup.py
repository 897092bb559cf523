"""The sources marker, and FlashInfer's own run-time lookup landing on the AOT wheel."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.aot import check, wheel
from sm120fork.errors import BuildError


def _tree(root: Path) -> Path:
    for rel, text in {"csrc/a.cu": "kernel", "include/flashinfer/b.cuh": "header",
                      "include/flashinfer/comm/c.cuh": "more"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_digest_follows_the_documented_rule(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    lines = sorted(f"{rel}\0{hashlib.sha256(text.encode()).hexdigest()}\n" for rel, text in {
        "csrc/a.cu": "kernel", "include/flashinfer/b.cuh": "header",
        "include/flashinfer/comm/c.cuh": "more"}.items())
    expected = "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()
    assert wheel.own_digest(tree / "csrc", tree / "include") == expected
    assert wheel.tree_digest(tree) == (expected, "sm120fork (the tree has no "
                                            "flashinfer/jit/provenance.py)")
    (tree / "csrc" / "a.cu").write_text("changed")
    assert wheel.own_digest(tree / "csrc", tree / "include") != expected


def test_the_trees_own_implementation_is_used_and_must_agree(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    impl = tree / "flashinfer" / "jit" / "provenance.py"
    impl.parent.mkdir(parents=True)
    mine = wheel.own_digest(tree / "csrc", tree / "include")
    impl.write_text(f"def sources_digest(csrc, include):\n    return {mine!r}\n")
    assert wheel.tree_digest(tree) == (mine, "flashinfer/jit/provenance.py")
    impl.write_text("def sources_digest(csrc, include):\n    return 'sha256:' + '1' * 64\n")
    with pytest.raises(BuildError, match="differs from the rule"):
        wheel.tree_digest(tree)


@pytest.mark.network
@pytest.mark.slow
def test_stock_flashinfer_never_looks_in_the_aot_wheel_and_aot_check_says_so(
        tmp_path: Path) -> None:
    """Stock FlashInfer 0.6.7.post3 from the index, our wheel beside it: the wheel is a
    distribution of its own, found only by our FlashInfer's added lookup (patch 0003)."""
    dl = tmp_path / "dl"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--disable-pip-version-check", "-d", str(dl),
                    "flashinfer-python==0.6.7.post3"], check=True)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(site),
                    *map(str, dl.glob("*.whl"))], check=True)
    data = site / "flashinfer" / "data"
    so = tmp_path / "trtllm_comm.so"
    so.write_bytes(b"\x7fELF stand-in")
    build = wheel.FlashInferBuild(
        distribution="flashinfer-python", version="0.6.7.post3", wheel="x.whl",
        sha256="0" * 64, tree="0" * 40, patched_commit="0" * 40,
        upstream_version="0.6.7.post3", series_digest="0" * 64)
    made = wheel.write_wheel(
        tmp_path / "ours", flashinfer=build, cuda_version="13.0", platform="linux_x86_64",
        modules=[wheel.Module(name="trtllm_comm", so=so, targets=("sm_90a",), info={},
                              sources_digest=wheel.own_digest(data / "csrc",
                                                                   data / "include"))],
        stack="sglang-0.5.10", toolkit_version="0", toolchain={})
    target = tmp_path / "site-ours"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(target), str(made)],
                   check=True)
    found = check.lookup(env={"PYTHONPATH": f"{target}:{site}",
                              "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")})
    assert found.lookup is None
    assert found.modules["trtllm_comm"].loads_from is None
    problems = check.check_installed(wheel.read_wheel(made), found)
    assert any("has no lookup for prebuilt-module packages" in p for p in problems), problems
    assert "trtllm_comm: loads from nowhere prebuilt: JIT-compiled" in check.describe(found)
