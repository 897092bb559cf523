"""Stacks are data: the SGLang behaviour checks are chosen by the layout a stack names.

What differs between SGLang releases lives in one adapter package per upstream layout
(``sm120fork.layouts.<name>``); a stack on a known layout needs a toml and patches only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.errors import ConfigError
from sm120fork.gpu.layer.run import layout_of
from sm120fork.layouts import LAYOUTS, adapter
from sm120fork.patch.series import load_series
from sm120fork.standing import claims
from sm120fork.verify.proof.stack import VerifyResult
from sm120fork.workspace import Workspace

from helpers_ws import checkout_copy

REPO = Path(__file__).resolve().parents[2]
PROBE_PYTHON = os.environ.get("SM120FORK_VERIFY_PYTHON", sys.executable)


def test_no_module_function_or_file_under_src_is_named_after_a_version() -> None:
    files = subprocess.run(["git", "ls-files", "src/*"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert [f for f in files if re.search(r"0_?5_?[0-9]{2}|05[0-9]{2}[^0-9]", f)] == []
    named = [f"{f}: {m.group(0)}" for f in files if f.endswith(".py")
             for m in re.finditer(r"(def|class) \w*0_5_[0-9]+", (REPO / f).read_text())]
    assert named == []


def test_every_stack_with_behaviour_evidence_names_a_known_layout() -> None:
    ws = Workspace(REPO)
    seen = {}
    for stack in ws.stacks().values():
        for project in stack.projects:
            series = load_series(ws.series_dir(project))
            if any(c.kind == "sglang" for p in series.patches for c in claims(p)):
                assert project.layout in LAYOUTS, (stack.name, project.key)
                seen[stack.name] = project.layout
    assert seen == {"sglang-0.5.10": "communicator", "sglang-0.5.23": "layer_boundary"}


def test_each_layout_has_checks_and_a_rank_setup() -> None:
    for name in LAYOUTS:
        assert callable(adapter(name).check)
        rank = adapter(name)
        assert callable(rank.setup)
        assert rank.WARNING_SAYS


def test_g1_to_g5_claim_the_layer_boundary_behaviour_checks() -> None:
    """They carried no Verified-By, so no evidence run could show them."""
    ws = Workspace(REPO)
    project = ws.stack("sglang-0.5.23").project("sglang")
    series = load_series(ws.series_dir(project))
    claimed = {p.subject.split()[0]: [c.text for c in claims(p)] for p in series.patches}
    assert all(claimed.values()), claimed  # every patch of the series has evidence
    assert {gid: claimed[gid] for gid in ("G1", "G2", "G3", "G4", "G5")} == {
        f"G{i}": [f"sglang:G{i}"] for i in range(1, 6)}


def test_an_unknown_layout_is_refused_naming_the_key(tmp_path: Path) -> None:
    root = checkout_copy(tmp_path, sdists=False)
    toml = root / "forks" / "sglang-0.5.23.toml"
    toml.write_text(toml.read_text().replace('layout = "layer_boundary"',
                                             'layout = "layer_boundry"'))
    with pytest.raises(ConfigError, match=r"projects\.sglang\.layout.*layer_boundary"):
        Workspace(root).stack("sglang-0.5.23")


@pytest.mark.network
@pytest.mark.slow
def test_a_stack_on_a_known_layout_needs_only_a_toml_and_patches(
        sglang_next_verify: VerifyResult) -> None:
    """A copy of sglang-0.5.23 under another name runs the evidence end to end (build,
    fingerprints, the layer_boundary checks): nothing in the toolkit names the stack.
    (helpers_sglang makes the run once; test_stack2 reads its checks.)"""
    result = sglang_next_verify
    assert result.stack == "sglang-next"
    verdicts = {v.patch.split("-")[1]: v for v in result.verdicts if v.project == "sglang"}
    assert sorted(verdicts) == ["G1", "G2", "G3", "G4", "G5", "G6", "G7"]
    # The layout's checks back G1-G5; G6 and G7 claim CPU tests of this checkout's tests/,
    # which the copy's root does not have, so their verdicts (and the overall one) are not
    # asserted.
    for gid in ("G1", "G2", "G3", "G4", "G5"):
        assert verdicts[gid].passed, verdicts[gid].checks
        assert verdicts[gid].evidence == "CPU behaviour check", gid
    assert result.sglang
    assert all(r.passed for r in result.sglang)


@pytest.mark.parametrize(("file", "text", "layout"), [
    ("version.py", '__version__ = "0.5.10.post1"\n', "communicator"),
    ("_version.py", "__version__ = version = '0.5.23+sm120.1'\n", "layer_boundary")])
def test_the_layer_harness_takes_the_layout_a_stack_names_for_the_trees_version(
        tmp_path: Path, file: str, text: str, layout: str) -> None:
    """Not a guess from which files exist: the version, looked up in forks/*.toml."""
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / file).write_text(text)
    assert layout_of(tmp_path, REPO) == layout


def test_a_tree_of_a_release_no_stack_pins_needs_layout_named(tmp_path: Path) -> None:
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "version.py").write_text('__version__ = "0.5.99"\n')
    with pytest.raises(ConfigError, match="pass --layout"):
        layout_of(tmp_path, REPO)
