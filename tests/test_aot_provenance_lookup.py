"""The sources marker, and FlashInfer's own run-time lookup landing on the AOT wheel."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.aot import check, provenance, wheel
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
    assert provenance.own_digest(tree / "csrc", tree / "include") == expected
    assert provenance.tree_digest(tree) == (expected, "sm120fork (the tree has no "
                                            "flashinfer/jit/provenance.py)")
    (tree / "csrc" / "a.cu").write_text("changed")
    assert provenance.own_digest(tree / "csrc", tree / "include") != expected


def test_the_trees_own_implementation_is_used_and_must_agree(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    impl = tree / "flashinfer" / "jit" / "provenance.py"
    impl.parent.mkdir(parents=True)
    mine = provenance.own_digest(tree / "csrc", tree / "include")
    impl.write_text(f"def sources_digest(csrc, include):\n    return {mine!r}\n")
    assert provenance.tree_digest(tree) == (mine, "flashinfer/jit/provenance.py")
    impl.write_text("def sources_digest(csrc, include):\n    return 'sha256:' + '1' * 64\n")
    with pytest.raises(BuildError, match="differs from the rule"):
        provenance.tree_digest(tree)


@pytest.mark.network
@pytest.mark.slow
def test_flashinfers_own_lookup_finds_the_wheels_module(tmp_path: Path) -> None:
    """Stock FlashInfer 0.6.7.post3 from the index, our wheel beside it: is_aot, same bytes."""
    dl = tmp_path / "dl"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--disable-pip-version-check", "-d", str(dl),
                    "flashinfer-python==0.6.7.post3"], check=True)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", "--target", str(site),
                    *map(str, dl.glob("*.whl"))], check=True)
    data = site / "flashinfer" / "data"
    shipped = provenance.own_digest(data / "csrc", data / "include")
    so = tmp_path / "trtllm_comm.so"
    so.write_bytes(b"\x7fELF stand-in")
    build = wheel.FlashInferBuild(
        distribution="flashinfer-python", version="0.6.7.post3", wheel="x.whl",
        sha256="0" * 64, tree="0" * 40, patched_commit="0" * 40,
        upstream_version="0.6.7.post3", series_digest="0" * 64)

    def install(digest: str, name: str) -> tuple[dict[str, object], list[str]]:
        made = wheel.write_wheel(
            tmp_path / name, flashinfer=build, cuda_version="13.0", platform="linux_x86_64",
            modules=[wheel.Module(name="trtllm_comm", so=so, targets=("sm_90a",), info={},
                                  sources_digest=digest)],
            stack="sglang-0.5.10", toolkit_version="0", toolchain={})
        target = tmp_path / f"site-{name}"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--disable-pip-version-check", "--target", str(target), str(made)],
                       check=True)
        found = check.lookup(env={"PYTHONPATH": f"{target}:{site}",
                                  "FLASHINFER_WORKSPACE_BASE": str(tmp_path / name)})
        return found, check.check_installed(wheel.read_wheel(made), found)

    found, problems = install(shipped, "good")
    assert problems == []
    assert found["is_aot"] is True
    assert Path(str(found["aot_path"])).is_relative_to(tmp_path / "site-good")
    assert found["jit_cache_version"] == "0.6.7.post3+cu130"
    _, problems = install("sha256:" + "1" * 64, "stale")
    assert any("would be refused" in p for p in problems)
