"""Behaviour checks of the SGLang series against the real patched and unpatched modules.

The slow tests need the sglang 0.5.10.post1 sdist (SM120FORK_SGLANG_SDIST, or the
toolkit's download cache) and an interpreter with src/sm120fork/verify_requirements.txt
installed (SM120FORK_VERIFY_PYTHON, default: this one); without them they are skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sm120fork.errors import VerifyError
from sm120fork.verify_sglang import SM12X, UNCHANGED, CheckResult, check_sglang

from conftest import FIXED_DATE, PATCH_AUTHOR

REPO = Path(__file__).resolve().parents[1]
SERIES = REPO / "patches" / "sglang-0.5.10" / "sglang"
SDIST_NAME = "sglang-0.5.10.post1.tar.gz"
SDIST_CANDIDATES = [
    Path(os.environ.get("SM120FORK_SGLANG_SDIST", "/nonexistent")),
    REPO / ".forks" / "cache" / "sdists" / SDIST_NAME,
    Path("/work/cache/sdists") / SDIST_NAME,
]
PROBE_PYTHON = os.environ.get("SM120FORK_VERIFY_PYTHON", sys.executable)


@pytest.fixture(scope="module")
def sglang_trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(patched, upstream) repository roots: the sdist under python/, the series on top.

    Plain git on purpose; the toolkit's pipeline may replace this one fixture.
    """
    sdist = next((p for p in SDIST_CANDIDATES if p.is_file()), None)
    if sdist is None:
        pytest.skip(f"{SDIST_NAME} not found (set SM120FORK_SGLANG_SDIST)")
    probe = subprocess.run([PROBE_PYTHON, "-c", "import torch, transformers"],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"{PROBE_PYTHON} lacks src/sm120fork/verify_requirements.txt")
    root = tmp_path_factory.mktemp("sglang")
    name, email = PATCH_AUTHOR.rstrip(">").split(" <")
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent),
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": FIXED_DATE,
           "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
           "GIT_COMMITTER_DATE": FIXED_DATE}

    def git(cwd: Path, *args: str) -> None:
        subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)

    upstream, patched = root / "upstream", root / "patched"
    (upstream / "python").mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            member.name = member.name.partition("/")[2]
            if member.name:
                tar.extract(member, upstream / "python", filter="data")
    git(upstream, "init", "-q", "-b", "main")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "sglang 0.5.10.post1")
    git(root, "clone", "-q", str(upstream), str(patched))
    lines = (SERIES / "series").read_text().splitlines()
    patches = [str(SERIES / ln.strip()) for ln in lines if ln.strip() and ln[0] != "#"]
    git(patched, "am", "-q", *patches)
    return patched, upstream


@pytest.fixture(scope="module")
def results(sglang_trees: tuple[Path, Path]) -> list[CheckResult]:
    patched, upstream = sglang_trees
    return check_sglang(patched, baseline=upstream, python=PROBE_PYTHON)


def _named(results: list[CheckResult], prefix: str, cap: str) -> dict[str, CheckResult]:
    return {r.name.removeprefix(prefix).strip(): r for r in results
            if r.name.startswith(prefix) and r.capability == cap}


@pytest.mark.slow
@pytest.mark.parametrize("cap", SM12X)
def test_explicit_flag_fuses_on_sm12x_at_every_tp(results: list[CheckResult], cap: str) -> None:
    explicit = _named(results, "S1", cap)
    assert sorted(explicit) == ["explicit-flag tp2", "explicit-flag tp4", "explicit-flag tp8"]
    for result in explicit.values():
        assert result.passed, result
        assert result.observed == '{"flag":true,"fused":true}'


@pytest.mark.slow
@pytest.mark.parametrize("cap", SM12X)
def test_auto_enable_on_sm12x_only_at_tp2_unless_overridden(
        results: list[CheckResult], cap: str) -> None:
    auto = _named(results, "S2", cap)
    assert all(r.passed for r in auto.values()), [r for r in auto.values() if not r.passed]
    fused = {name: '"fused":true' in r.observed for name, r in auto.items()}
    assert {f"auto tp{tp}" for tp in (1, 2, 4, 8) if fused[f"auto tp{tp}"]} == {"auto tp2"}
    env = "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO"
    assert fused[f"auto tp8 {env}=1"]
    assert fused[f"auto tp4 {env}=on"]
    assert not fused[f"auto tp2 {env}=0"]
    assert not fused[f"auto tp2 {env}=off"]
    assert auto[f"auto tp2 {env}=maybe"].observed == '"error"'
    assert "is not a valid value" in auto[f"auto tp2 {env}=maybe"].detail
    assert "TP4 regressed upstream" in auto["auto tp4"].detail
    assert not fused["enforce-disable auto tp2"]


@pytest.mark.slow
def test_nothing_changes_for_sm80_sm90_sm100(results: list[CheckResult]) -> None:
    unchanged = [r for r in results if r.name.startswith("unchanged")]
    assert {r.capability for r in unchanged} == set(UNCHANGED)
    decisions = [r for r in results if r.capability == "12.0" and r.name[:2] in ("S1", "S2")]
    assert len(unchanged) == 3 * len(decisions)
    assert all(r.passed for r in unchanged), [r for r in unchanged if not r.passed]


@pytest.mark.slow
def test_unfused_fallback_all_reduces(results: list[CheckResult]) -> None:
    (fallback,) = [r for r in results if r.name.startswith("S3")]
    assert fallback.passed, fallback
    assert "all-reduce called with [(3, 64)]" in fallback.detail


@pytest.mark.slow
def test_missing_p2p_or_workspace_fails_closed(results: list[CheckResult]) -> None:
    fail_closed = {r.name: r for r in results if r.name.startswith("S4")}
    assert sorted(fail_closed) == ["S4 no P2P between the GPUs", "S4 workspace creation raises"]
    assert all(r.passed for r in fail_closed.values()), fail_closed
    assert "GPU 0" in fail_closed["S4 no P2P between the GPUs"].detail
    assert "multicast" in fail_closed["S4 workspace creation raises"].detail


@pytest.mark.slow
def test_unpatched_upstream_fails_the_sm12x_checks(sglang_trees: tuple[Path, Path]) -> None:
    _, upstream = sglang_trees
    results = check_sglang(upstream, baseline=None, python=PROBE_PYTHON)
    failed = {r.name.split()[0] for r in results if not r.passed}
    assert failed == {"S1", "S2", "S3", "S4"}
    # Without a baseline, 8.0/9.0/10.0 are judged by the known upstream decisions.
    assert all(r.passed for r in results if r.name.startswith("unchanged"))


def test_a_probe_that_cannot_run_is_a_verify_error(tmp_path: Path) -> None:
    (tmp_path / "python" / "sglang").mkdir(parents=True)  # a package without srt/
    (tmp_path / "python" / "sglang" / "__init__.py").touch()
    with pytest.raises(VerifyError, match="probe") as info:
        check_sglang(tmp_path, baseline=None, python=sys.executable, jobs=1)
    assert "verify_requirements.txt" in str(info.value)


def test_a_tree_without_python_dir_is_a_verify_error(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="python/sglang"):
        check_sglang(tmp_path / "patched", baseline=tmp_path, python=sys.executable)
