"""Stack sglang-0.5.23 for real: the published wheels, the series G1-G5, the behaviour.

Marked network + slow: the first run downloads sglang 0.5.23 (six wheels, ~230 MB) and
flashinfer-python 0.7.2 (62 MiB) into this checkout's ``.forks/cache/wheels`` and the
probe overlay into ``.forks/probe``; later runs (and CI re-runs) reuse them.  The stack
is built once per session (module fixture) and every test reads that build.
The behaviour tests need an interpreter with the sglang-probe dependency group
(SM120FORK_VERIFY_PYTHON, default: this one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sm120fork.layouts.layer_boundary import SM12X, UNCHANGED, ensure_overlay
from sm120fork.layouts.results import CheckResult
from sm120fork.package.publish import ProjectBuild
from sm120fork.package.stack import build_stack
from sm120fork.patch.series import load_series
from sm120fork.util.files import sha256_file
from sm120fork.verify.proof.stack import VerifyResult
from sm120fork.workspace import Workspace

from helpers_ws import checkout_copy

REPO = Path(__file__).resolve().parents[2]
STACK = "sglang-0.5.23"
PROBE_PYTHON = os.environ.get("SM120FORK_VERIFY_PYTHON", sys.executable)
CACHE = REPO / ".forks" / "cache" / "wheels"

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = checkout_copy(tmp_path_factory.mktemp("stack2"), sdists=False)
    CACHE.mkdir(parents=True, exist_ok=True)
    (root / ".forks" / "cache").mkdir(parents=True)
    # The downloads are shared with the checkout (sha256 is checked on every use).
    (root / ".forks" / "cache" / "wheels").symlink_to(CACHE)
    return Workspace(root)


@pytest.fixture(scope="module")
def builds(workspace: Workspace) -> list[ProjectBuild]:
    return build_stack(workspace, workspace.stack(STACK))


def test_a_second_build_leaves_the_stack_folder_byte_identical(
        workspace: Workspace, builds: list[ProjectBuild]) -> None:
    """The release step stages the plugin with the wheels (a second build failed: "it
    holds files a build did not publish (plugin)")."""
    out = workspace.stack_wheels(STACK)

    def tree() -> dict[str, str]:
        return {p.relative_to(out).as_posix(): sha256_file(p)
                for p in sorted(out.rglob("*")) if p.is_file()}

    first = tree()
    assert "plugin/plugin.json" in first
    again = build_stack(workspace, workspace.stack(STACK))
    assert all(b.cached for b in again)
    assert tree() == first


def test_flashinfer_is_used_as_published(builds: list[ProjectBuild]) -> None:
    (fi,) = [b for b in builds if b.project == "flashinfer"]
    assert fi.wheel.name == "flashinfer_python-0.7.2-py3-none-any.whl"
    assert fi.entry.used_as_published is True
    assert fi.sha256 == sha256_file(fi.wheel) == (
        "770550a0aa92b2f10e6c9a1f048dd43713f0f3bb6a12710186fcf8e4e9c99bd8")


def test_sglang_wheels_are_patched_and_otherwise_the_published_bytes(
        workspace: Workspace, builds: list[ProjectBuild]) -> None:
    sglang = [b for b in builds if b.project == "sglang"]
    assert sorted(b.wheel.name for b in sglang) == sorted(
        f"sglang-0.5.23+sm120.1-cp3{minor}-cp3{minor}-manylinux_2_34_{arch}.whl"
        for minor in (11, 12, 13) for arch in ("x86_64", "aarch64"))
    # What the series touches (its own word, so a patch added to it changes the expectation).
    series = load_series(workspace.root / "patches" / STACK / "sglang")
    changed = {f.removeprefix("python/") for p in series.patches for f in p.files}
    fingerprints = sum(len(p.fingerprints) for p in series.patches)
    for b in sglang:
        assert all(r.passed for r in b.entry.artifact_check)
        assert len(b.entry.artifact_check) == fingerprints
        original = CACHE / str(b.entry.source.filename)
        with zipfile.ZipFile(original) as old, zipfile.ZipFile(b.wheel) as new:
            # Files only: the published wheel also lists directories, wheel pack does not.
            old_files = [n for n in old.namelist() if not n.endswith("/")]
            renamed = {n.replace("sglang-0.5.23.dist-info", "sglang-0.5.23+sm120.1.dist-info")
                       for n in old_files}
            # a module the series adds (G7's) ships in every wheel; nothing else is new
            added = changed - set(old_files)
            assert added == {"sglang/srt/layers/sm120fork_allreduce.py"}
            assert renamed | added == set(new.namelist())
            differ = {n for n in old_files
                      if not n.startswith("sglang-0.5.23.dist-info/")
                      and old.read(n) != new.read(n)}
            assert differ == changed - added
            assert old.read("sglang-0.5.23.dist-info/WHEEL") == new.read(
                "sglang-0.5.23+sm120.1.dist-info/WHEEL")


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
@pytest.mark.parametrize("platform", ["manylinux_2_34_x86_64", "manylinux_2_34_aarch64"])
def test_pip_resolves_our_build_on_every_python_and_platform_of_the_release(
        workspace: Workspace, builds: list[ProjectBuild], python: str, platform: str,
        tmp_path: Path) -> None:
    """Issue 18.5: the install line of the README resolves to our sglang build on every
    Python and platform sglang 0.5.23 publishes a wheel for (cp313 included)."""
    folder = workspace.root / "wheels" / STACK
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-index",
                    "--no-deps", "--ignore-installed", "--only-binary=:all:",
                    "--python-version", python, "--platform", platform,
                    "--target", str(tmp_path / "t"), "--report", str(report),
                    "-c", str(folder / "constraints.txt"), "--find-links", str(folder),
                    "sglang"], check=True)
    (chosen,) = json.loads(report.read_text())["install"]
    assert chosen["metadata"]["version"] == "0.5.23+sm120.1"
    assert f"cp{python.replace('.', '')}" in chosen["download_info"]["url"]


def test_cp311_wheel_installs_and_imports_here(builds: list[ProjectBuild],
                                               tmp_path: Path) -> None:
    (cp311,) = [b for b in builds if "cp311-cp311-manylinux_2_34_x86_64" in b.wheel.name]
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(target), str(cp311.wheel)], check=True)
    overlay = ensure_overlay(REPO / ".forks" / "probe", python=PROBE_PYTHON)
    code = ("from sm120fork.harness.fake_gpu import fake_gpu; fake_gpu((12, 0)); "
            "import importlib.metadata as m, sglang.srt.layers.flashinfer_comm_fusion as f; "
            "print(m.version('sglang')); print(f.__file__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(overlay), str(target),
                                                         str(REPO / "src")])}
    out = subprocess.run([PROBE_PYTHON, "-c", code], check=True, capture_output=True,
                         text=True, env=env, cwd=tmp_path).stdout.splitlines()
    assert out[-2] == "0.5.23+sm120.1"
    assert out[-1].startswith(str(target))
    assert "FlashInfer allreduce fusion on SM12x GPUs supports single-node" in Path(
        out[-1]).read_text()


@pytest.fixture(scope="module")
def results(sglang_next_verify: VerifyResult) -> tuple[CheckResult, ...]:
    """The layer_boundary checks of sglang-0.5.23's patched tree against the unpatched one
    (``check``), as ``run_verify`` runs them on this stack's copy under another name
    (its first wheel, the same series: the same trees, made once per run and shared with
    test_layouts, which asserts that run's verdicts)."""
    return sglang_next_verify.sglang


def _named(results: tuple[CheckResult, ...], prefix: str, cap: str) -> dict[str, CheckResult]:
    return {r.name.removeprefix(prefix).strip(): r for r in results
            if r.name.startswith(prefix) and r.capability == cap}


@pytest.mark.parametrize("cap", SM12X)
def test_g1_trtllm_resolves_on_one_node_and_multicast_backends_are_refused(
        results: tuple[CheckResult, ...], cap: str) -> None:
    resolve = _named(results, "G1 resolve:", cap)
    assert all(r.passed for r in resolve.values()), [r for r in resolve.values() if not r.passed]
    assert resolve["auto nodes1"].observed == '"trtllm"'
    assert resolve["mnnvl nodes1"].observed == '"error"'
    assert "SM12x" in resolve["cutedsl nodes1"].detail


@pytest.mark.parametrize("cap", SM12X)
def test_g2_auto_enable_only_at_tp2_on_one_node_unless_overridden(
        results: tuple[CheckResult, ...], cap: str) -> None:
    auto = _named(results, "G2 auto:", cap)
    assert all(r.passed for r in auto.values()), [r for r in auto.values() if not r.passed]
    enabled = {n for n, r in auto.items() if '"backend":"auto"' in r.observed}
    assert {n for n in enabled if "=" not in n} == {"auto tp2 nodes1"}
    assert auto["explicit-trtllm tp8 nodes1"].observed.count('"trtllm"') == 2
    assert all('"sm12x_log_lines":1' in r.observed for r in auto.values()
               if r.observed != '"error"')


@pytest.mark.parametrize("cap", SM12X)
def test_g3_g4_g5_on_sm12x(results: tuple[CheckResult, ...], cap: str) -> None:
    for prefix in ("G3 applies:", "G4 preflight:", "G5 plain:"):
        checks = _named(results, prefix, cap)
        assert checks, prefix
        assert all(r.passed for r in checks.values()), [r for r in checks.values()
                                                        if not r.passed]
    assert _named(results, "G3 applies:", cap)["backend=trtllm batch16"].observed == "true"
    assert '"multicast_queried":false' in _named(results, "G4 preflight:", cap)[
        "no multicast"].observed


@pytest.mark.parametrize("cap", UNCHANGED)
def test_other_gpus_decide_as_upstream(results: tuple[CheckResult, ...], cap: str) -> None:
    unchanged = _named(results, "unchanged", cap)
    assert len(unchanged) > 40
    assert all(r.passed for r in unchanged.values()), [r for r in unchanged.values()
                                                       if not r.passed]
