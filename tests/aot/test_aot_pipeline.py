"""build-aot refuses a FlashInfer tree or manifest that is not the published wheel's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sm120fork.aot import pipeline
from sm120fork.declare import load_stacks
from sm120fork.errors import ConfigError

from conftest import git

REPO = Path(__file__).resolve().parents[2]


def _manifest(path: Path, **changes: object) -> None:
    entry: dict[str, object] = {"project": "flashinfer", "distribution": "flashinfer-python",
             "version": "0.6.7.post3+sm120.1", "wheel": "w.whl", "sha256": "a" * 64,
             "tree": "b" * 40, "patched_commit": "c" * 40, "upstream_version": "0.6.7.post3",
             "series_digest": "d" * 64}
    entry.update(changes)
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({"stack": "sglang-0.5.10",
                                                    "wheels": [entry]}))


def test_the_flashinfer_entry_of_the_stacks_manifest(tmp_path: Path) -> None:
    stack = load_stacks(REPO / "forks")["sglang-0.5.10"]
    _manifest(tmp_path)
    build = pipeline.flashinfer_build(tmp_path, stack)
    assert build.version == "0.6.7.post3+sm120.1"
    assert build.sha256 == "a" * 64
    with pytest.raises(ConfigError, match=r"no readable manifest\.json"):
        pipeline.flashinfer_build(tmp_path / "none", stack)
    other = load_stacks(REPO / "forks")["flashinfer-0.7.4"]
    with pytest.raises(ConfigError, match=r"not 'flashinfer-0\.7\.4'"):
        pipeline.flashinfer_build(tmp_path, other)
    _manifest(tmp_path / "short", sha256=None)
    data = json.loads((tmp_path / "short" / "manifest.json").read_text())
    del data["wheels"][0]["sha256"]
    (tmp_path / "short" / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="lacks 'sha256'"):
        pipeline.flashinfer_build(tmp_path / "short", stack)


def test_tree_hash_is_heads_tree_and_refuses_local_changes(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "-q")
    (tree / "a.cu").write_text("x")
    git(tree, "add", "a.cu")
    git(tree, "commit", "-qm", "one")
    assert pipeline.tree_hash(tree) == git(tree, "rev-parse", "HEAD^{tree}")
    (tree / "a.cu").write_text("changed")
    with pytest.raises(ConfigError, match="uncommitted changes"):
        pipeline.tree_hash(tree)


def test_a_flashinfer_without_the_prebuilt_lookup_gets_no_aot_wheel(tmp_path: Path) -> None:
    """Issue 18.3 for stack sglang-0.5.23: FlashInfer 0.7.2 as published never looks in a
    package of our own name, so build-aot refuses instead of making a wheel that never loads."""
    stacks = load_stacks(REPO / "forks")
    env = tmp_path / "flashinfer" / "jit" / "env.py"
    env.parent.mkdir(parents=True)
    env.write_text("FLASHINFER_AOT_DIR = _package_root / 'data' / 'aot'\n")
    with pytest.raises(ConfigError, match="no lookup for prebuilt-module packages"):
        pipeline.require_lookup(tmp_path, stacks["sglang-0.5.23"])
    # The default stack's series adds it (patch 0003).
    patch = next((REPO / "patches" / "sglang-0.5.10" / "flashinfer").glob("0009-*.patch"))
    assert '+PREBUILT_ENTRY_POINT_GROUP = "flashinfer.prebuilt"' in patch.read_text()
    env.write_text('PREBUILT_ENTRY_POINT_GROUP = "flashinfer.prebuilt"\n')
    pipeline.require_lookup(tmp_path, stacks["sglang-0.5.10"])
