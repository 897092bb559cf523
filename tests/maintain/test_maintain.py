"""status, bump and refresh on real temporary git repos and a local package index."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sm120fork.cli.main import main
from sm120fork.entry import relative
from sm120fork.errors import (
    ConfigError,
    DirtyTreeError,
    MaintenanceError,
    SeriesError,
)
from sm120fork.maintain.bump import bump, bump_abort, bump_continue
from sm120fork.maintain.refresh import refresh
from sm120fork.maintain.state import (
    CONFLICT,
    DROPPED_BY_HAND,
    RESOLVED,
    STILL_NEEDED,
    UPSTREAMED_DIFFERENTLY,
    UPSTREAMED_IDENTICALLY,
    Classification,
)
from sm120fork.maintain.status import status
from sm120fork.package.stack import build_stack
from sm120fork.patch.series import Fingerprint, parse_patch
from sm120fork.resolved import ResolvedStack

from conftest import git, make_patch, write_series
from helpers_maintain import (
    ENCODED_AUTHOR,
    STACK,
    BumpWorkspace,
    count_series_loads,
    make_bump_workspace,
    pack_wheel,
    package_index,
    reauthor_last_patch,
    snapshot,
    stack_of,
)
from helpers_ws import DemoWorkspace, make_demo, sha256


def work_tree(bw: BumpWorkspace) -> Path:
    return bw.ws.trees_dir / STACK / "lib"


def start_bump(bw: BumpWorkspace, **kw: str) -> MaintenanceError:
    with pytest.raises(MaintenanceError) as err:
        bump(stack_of(bw.ws, STACK), "lib", "1.3.0", git_commit=bw.new.commit,
             **kw)  # type: ignore[arg-type]
    return err.value


# --------------------------------------------------------------------------- fields
def test_effect_fields_are_parsed_and_validated(tmp_path: Path) -> None:
    from conftest import make_upstream

    up = make_upstream(tmp_path, files={"{pkg}/conf.py": "LIMIT = 8\n"})
    d = tmp_path / "p"
    good = make_patch(up.repo, d, "S1 conf", {"demo_lib/conf.py": ("LIMIT = 8", "LIMIT = 16")},
                      "demo_lib/conf.py: LIMIT = 16",
                      extra_fields="Effect: demo_lib/conf.py: re:LIMIT = (16|32)\n"
                                   "Effect-Absent: demo_lib/*.py: LIMIT = 8\n")
    patch = parse_patch(good)
    assert patch.effects == (Fingerprint(path="demo_lib/conf.py", text="re:LIMIT = (16|32)"),)
    assert patch.effects_absent == (Fingerprint(path="demo_lib/*.py", text="LIMIT = 8"),)
    bad = d / "bad.patch"
    bad.write_text(good.read_text().replace("re:LIMIT = (16|32)", "re:LIMIT = (16"))
    with pytest.raises(SeriesError, match="regex"):
        parse_patch(bad)
    bad.write_text(good.read_text().replace("Effect: demo_lib/conf.py: re:", "Effect: nopath"))
    with pytest.raises(SeriesError, match="malformed Effect"):
        parse_patch(bad)


def test_effect_text_folds_whitespace_and_regex_searches() -> None:
    upstream = "if (\n    has_sm90\n    or has_sm120\n):\n    append(comm())\n"
    assert Fingerprint(path="a", text="or has_sm120 ): append(comm())").found_in(upstream)
    assert not Fingerprint(path="a", text="has_sm90 or has_sm100").found_in(upstream)
    assert Fingerprint(path="a", text=r"re:has_sm90\b[^:]*has_sm120[^:]*:").found_in(upstream)


@pytest.mark.slow
def test_encoded_subject_and_author_come_out_decoded(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120FORK_TODAY", "2026-11-30")
    bw = make_bump_workspace(tmp_path, new_files={"{pkg}/conf.py": "LIMIT = 8\n"})
    subject = "S4 Jürgen: larger limit"
    patch = reauthor_last_patch(bw.old.repo, bw.series_dir, subject)
    assert (parse_patch(patch).subject, parse_patch(patch).author) == (subject, ENCODED_AUTHOR)
    with package_index([bw.old.sdist, bw.new.sdist], "demo-lib") as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        assert status(bw.ws)[0].patches[-1].subject == subject
        result = bump(stack_of(bw.ws, STACK), "lib", "1.3.0", git_commit=bw.new.commit)
    assert (result.classifications[-1].subject, result.classifications[-1].verdict) == (
        subject, STILL_NEEDED)
    report = result.report.read_text()
    assert f"| {subject} | **still needed** |" in report
    assert "=?UTF-8?" not in report
    # The refreshed series keeps the author (git re-encodes it) and parses back the same.
    kept = bw.series_dir / (bw.series_dir / "series").read_text().split()[-1]
    assert (parse_patch(kept).subject, parse_patch(kept).author) == (subject, ENCODED_AUTHOR)


@pytest.mark.slow
def test_one_upstream_matcher_serves_the_artifact_check_status_and_bump(
        bw: BumpWorkspace, monkeypatch: pytest.MonkeyPatch) -> None:
    from packaging.version import Version

    from sm120fork.maintain.classify import classify
    from sm120fork.maintain.status import pinned_upstream
    from sm120fork.package.wheel import check_wheel
    from sm120fork.patch import series as upstream_match
    from sm120fork.patch.series import load_series
    from sm120fork.patch.tree import prepare_tree

    stack = bw.ws.stack(STACK)
    project = stack.project("lib")
    wheel = build_stack(bw.ws, stack)[0].wheel
    series = load_series(bw.series_dir)
    repo = pinned_upstream(bw.ws, stack, project)
    assert not any(r.in_upstream for r in check_wheel(wheel, project, series, repo))
    # Change the one definition: every consumer follows it.
    monkeypatch.setattr(upstream_match, "fingerprint_in", lambda fp, text: True)
    assert all(r.in_upstream for r in check_wheel(wheel, project, series, repo))
    assert {p.fingerprint_upstream for p in status(bw.ws)[0].patches} == {"PRESENT"}
    pristine = prepare_tree(bw.ws, stack, project, patches=(), variant="upstream").repo
    verdict, evidence = classify(pristine, series.patches[2], Version("1.3.0"))
    assert verdict == STILL_NEEDED
    assert evidence[1].startswith("but 1 fingerprint(s) already upstream: ")


# --------------------------------------------------------------------------- status
@pytest.mark.slow
def test_status_reports_every_patch_and_its_wheel(bw: BumpWorkspace) -> None:
    rows = status(bw.ws)
    assert [r.project for r in rows] == ["lib"]
    lib = rows[0]
    assert not lib.error
    assert [p.applies for p in lib.patches] == ["yes"] * 4
    assert [p.fingerprint_upstream for p in lib.patches] == ["absent"] * 4
    assert lib.patches[0].applied_upstream.startswith("1.3.0")
    assert lib.patches[1].effect_upstream == "absent"
    assert lib.patches[0].effect_upstream == "-"
    assert all(p.wheel == "-" for p in lib.patches)
    build_stack(bw.ws, bw.ws.stack(STACK))
    wheels = {p.wheel for p in status(bw.ws)[0].patches}
    assert wheels == {"demo_lib-1.2.3+sm120.1-py3-none-any.whl"}
    # A patch that no longer applies is named, the ones after it are not checked.
    p2 = bw.series_dir / (bw.series_dir / "series").read_text().split()[1]
    p2.write_text(p2.read_text().replace("-#if __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200",
                                         "-#if __CUDA_ARCH__ >= 800 && __CUDA_ARCH__ < 1200"))
    applies = [p.applies for p in status(bw.ws)[0].patches]
    assert applies[0] == "yes"
    assert applies[1].startswith("NO: demo_lib/kernel.cuh")
    assert applies[2:] == ["not checked", "not checked"]


@pytest.mark.slow
def test_status_reads_each_series_once(bw: BumpWorkspace,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack is resolved once for its rows and its evidence (each series was read
    twice: once for the patch rows, once for the records' standing)."""
    build_stack(bw.ws, bw.ws.stack(STACK))
    loaded = count_series_loads(monkeypatch)
    rows = status(bw.ws, [bw.ws.stack(STACK, strict=False)])
    assert rows[0].patches
    assert loaded == [bw.series_dir]


@pytest.mark.slow
def test_status_cli_json(bw: BumpWorkspace, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(bw.ws.root), "-q", "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["stack"] == STACK
    assert len(data[0]["patches"]) == 4
    assert set(data[0]["patches"][0]) >= {"applies", "fingerprint_upstream", "wheel",
                                          "applied_upstream", "forwarded"}


# --------------------------------------------------------------------------- bump
@pytest.mark.slow
def test_bump_classifies_each_patch_stops_at_conflict_and_finishes(bw: BumpWorkspace) -> None:
    decl_path = bw.ws.forks_dir / f"{STACK}.toml"
    decl_path.write_text(decl_path.read_text().replace(
        f'commit = "{bw.old.commit}"', f'commit = "{bw.old.commit}"  # the release commit'))
    err = start_bump(bw)
    assert "0004-S4-conf-larger-limit.patch conflicts" in err.message
    assert "--continue" in err.message
    assert "--abort" in err.message
    conf = (work_tree(bw) / "demo_lib" / "conf.py").read_text()
    assert "<<<<<<<" in conf
    assert "LIMIT = 4" in conf
    assert "LIMIT = 16  # sm12x" in conf
    # Not resolved yet: --continue refuses and keeps the conflict.
    with pytest.raises(MaintenanceError, match="conflict markers"):
        bump_continue(bw.ws, STACK, "lib")
    (work_tree(bw) / "demo_lib" / "conf.py").write_text("LIMIT = 16  # sm12x\n")
    # Re-running the same bump resumes, like --continue.
    result = bump(stack_of(bw.ws, STACK), "lib", "1.3.0")
    assert [(c.patch[:4], c.verdict) for c in result.classifications] == [
        ("0001", UPSTREAMED_IDENTICALLY), ("0002", UPSTREAMED_DIFFERENTLY),
        ("0003", STILL_NEEDED), ("0004", RESOLVED)]
    evidence = {c.patch[:4]: c.evidence for c in result.classifications}
    assert "reverse-applies cleanly" in evidence["0001"][0]
    assert any("Effect-Absent" in e and "absent" in e for e in evidence["0002"])
    assert any("agrees" in e for e in evidence["0002"])
    assert "the patch's effect holds on the resolved tree" in evidence["0004"]
    # The series now holds only what is still needed, rebased on 1.3.0.
    assert (bw.series_dir / "series").read_text().split() == [
        "0001-S3-util-helper-returns-2.patch", "0002-S4-conf-larger-limit.patch"]
    assert sorted(p.name for p in bw.series_dir.glob("*.patch")) == [
        "0001-S3-util-helper-returns-2.patch", "0002-S4-conf-larger-limit.patch"]
    decl = (bw.ws.forks_dir / f"{STACK}.toml").read_text()
    assert 'version = "1.3.0"' in decl
    assert f'sha256 = "{sha256(bw.new.sdist)}"' in decl
    assert 'filename = "demo_lib-1.3.0.tar.gz"' in decl
    assert "commit_verified = false" in decl
    assert f'commit = "{bw.new.commit}"  # the release commit' in decl
    report = (bw.ws.reports_dir / "bump" / "demo-lib-1.2.3-to-1.3.0.md").read_text()
    assert "**upstreamed identically**" in report
    assert "**upstreamed differently**" in report
    assert "## Range-diff" in report
    assert (f"Command: `python -m sm120fork bump demo lib 1.3.0 --git-commit {bw.new.commit}` "
            "(conflicts resolved by hand") in report
    assert "## Before applying: each patch against 1.3.0" in report
    assert "F1 gate: allow 12" in report
    changelog = (bw.ws.root / "patches" / STACK / "CHANGELOG.md").read_text()
    assert re.search(r"dropped 0001-F1-gate-allow-12\.patch .*upstreamed identically in "
                     r"demo-lib 1\.3\.0 \(Applied-Upstream: 1\.3\.0, "
                     r"https://example\.invalid/pull/1\)", changelog)
    assert "2026-11-30" in changelog
    assert not (bw.ws.state_dir / "bump").exists() or not any(
        (bw.ws.state_dir / "bump").iterdir())
    # The bumped series builds and passes the artifact check.
    builds = build_stack(bw.ws, bw.ws.stack(STACK))
    assert builds[0].version == "1.3.0+sm120.1"
    with zipfile.ZipFile(builds[0].wheel) as zf:
        assert zf.read("demo_lib/conf.py").decode() == "LIMIT = 16  # sm12x\n"
        assert "return [9, 10, 12]" in zf.read("demo_lib/__init__.py").decode()


@pytest.mark.slow
def test_a_bump_whose_series_ends_empty_ships_the_release_as_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Everything upstream but one patch that conflicts and is dropped (--skip): the bump
    finishes, the stack ships upstream's wheel unchanged, and it builds."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-11-30")
    monkeypatch.setenv("COLUMNS", "80")
    bw = make_bump_workspace(tmp_path, new_files={
        "{pkg}/util.py": "def helper():\n    return 2  # sm12x\n"})  # S3 identically
    wheel = pack_wheel(bw.new, tmp_path)
    # A file of the release the new pin cannot declare (the index lists no sha256 for it).
    unpinned = "demo_lib-1.3.0-cp313-cp313-manylinux_2_34_aarch64.whl"
    with package_index([bw.old.sdist, bw.new.sdist, wheel], "demo-lib",
                       unhashed=(unpinned,)) as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        root = ["--root", str(bw.ws.root)]
        assert main([*root, "bump", STACK, "lib", "1.3.0", "--git-commit", bw.new.commit,
                     "--new-stack", "demo-next"]) == 14
        err = capsys.readouterr().err
        assert "0004-S4-conf-larger-limit.patch conflicts" in err
        skip = "python -m sm120fork bump demo-next lib --skip"
        # At 80 columns (a pipe, a log) nothing is wrapped: the error is one line, and
        # each command in it pastes as printed.
        (error,) = [line for line in err.splitlines() if line.startswith("error: ")]
        assert f"`{skip}`" in error
        assert "`python -m sm120fork bump demo-next lib --abort`" in error
        assert "re:" not in err  # the regexes are in the report, not on the console
        assert main([*root, "bump", "demo-next", "lib", "--skip"]) == 0
        out = capsys.readouterr().out
        assert "next: python -m sm120fork build --stack demo-next\n" in out
        assert "ships demo-lib 1.3.0 as published (demo_lib-1.3.0-py3-none-any.whl)" in out
        assert "4 patch(es) left the series, 0 kept" in out
        assert "1 conflict, dropped by hand\n" in out
        # What `status` says of a release file the stack does not declare, bump says too.
        assert (f"release files: 1 NOT DECLARED: {unpinned} (declare them in "
                "forks/demo-next.toml, or on that Python/platform pip finds no patched "
                "build)\n") in out
        assert main([*root, "build", "--stack", "demo-next"]) == 0
        out = capsys.readouterr().out
        # The install line is one line at 80 columns (a pipe, a log): it pastes as printed.
        assert ("; install with: pip install -c wheels/demo-next/constraints.txt "
                "wheels/demo-next/*.whl\n") in out
        builds = build_stack(bw.ws, bw.ws.stack("demo-next"))
    series_dir = bw.ws.root / "patches" / "demo-next" / "lib"
    assert (series_dir / "series").read_text().split() == []
    assert not list(series_dir.glob("*.patch"))
    project = bw.ws.stack("demo-next").project("lib")
    assert [(w.filename, w.sha256) for w in project.wheels] == [(wheel.name, sha256(wheel))]
    assert (builds[0].version, builds[0].sha256) == ("1.3.0", sha256(wheel))
    assert builds[0].entry.used_as_published
    report = (bw.ws.reports_dir / "bump" / "demo-next-lib-1.2.3-to-1.3.0.md").read_text()
    assert "the series is empty: the stack ships demo-lib 1.3.0 as published" in report
    assert f"`{wheel.name}` sha256 `{sha256(wheel)}`" in report
    assert re.search(r"^4:  [0-9a-f]{7} < -:  ------- S4 conf: larger limit$", report, re.M)
    changelog = (bw.ws.root / "patches" / "demo-next" / "CHANGELOG.md").read_text()
    dropped = re.findall(r"^- dropped (\S+) ", changelog, re.MULTILINE)
    assert [d[:4] for d in dropped] == ["0001", "0002", "0003", "0004"]
    assert "at its conflict with demo-lib 1.3.0 (--skip)" in changelog
    assert "demo-lib 1.3.0 is used as published" in changelog
    assert [c.verdict for c in bump_result_verdicts(bw)] == [
        UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY, UPSTREAMED_IDENTICALLY, DROPPED_BY_HAND]
    assert bw.ws.stack(STACK).project("lib").version == "1.2.3"  # the source stack stays


def bump_result_verdicts(bw: BumpWorkspace) -> list[Classification]:
    report = (bw.ws.reports_dir / "bump" / "demo-next-lib-1.2.3-to-1.3.0.md").read_text()
    table = report.split("## Classification (as applied)")[1].split("##")[0]
    return [Classification(patch=r.split(" | ")[0][2:], subject="", evidence=(),
                           applied_upstream="", verdict=r.split(" | ")[2].strip("*"))
            for r in table.splitlines() if r.startswith("| 000")]


@pytest.mark.slow
def test_a_first_patch_that_conflicts_still_reports_every_later_patch(bw: BumpWorkspace) -> None:
    names = (bw.series_dir / "series").read_text().split()
    reordered = [names[3], *names[:3]]  # S4 (conflicts) first; the patches touch other files
    write_series(bw.series_dir, reordered)
    err = start_bump(bw)
    assert f"patch {names[3]} conflicts" in err.message
    expected = dict(zip(reordered, [CONFLICT, UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY,
                                    STILL_NEEDED], strict=True))
    for name, verdict in expected.items():
        assert f"  {name}: {verdict}\n" in f"{err.detail}\n"
    # The report exists before the bump is resolved, names every patch, and no machine path.
    report = (bw.ws.reports_dir / "bump" / "demo-lib-1.2.3-to-1.3.0.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| 000")]
    assert [(r.split(" | ")[0][2:], r.split(" | ")[2].strip("*")) for r in rows] == list(
        expected.items())
    assert f"{names[3]} conflicts with lib 1.3.0: demo_lib/conf.py" in report
    assert "`python -m sm120fork bump demo lib --abort`" in report
    assert str(bw.ws.root) not in report
    # It applied in order and stopped at the first conflict, like git am.
    assert git(work_tree(bw), "log", "--format=%s", "upstream..HEAD") == ""
    bump_abort(bw.ws, STACK, "lib")
    assert not (bw.ws.reports_dir / "bump" / "demo-lib-1.2.3-to-1.3.0.md").exists()


@pytest.mark.slow
def test_the_reports_command_line_reruns_as_printed(bw: BumpWorkspace) -> None:
    first = start_bump(bw)
    report = (bw.ws.reports_dir / "bump" / "demo-lib-1.2.3-to-1.3.0.md").read_text()
    command = re.search(r"Command: `([^`]+)`", report)
    assert command
    bump_abort(bw.ws, STACK, "lib")
    argv = shlex.split(command.group(1))
    assert argv[:3] == ["python", "-m", "sm120fork"]
    rerun = subprocess.run([sys.executable, *argv[1:]], cwd=bw.ws.root, capture_output=True,
                           text=True, check=False, env={**os.environ, "COLUMNS": "1000"})
    assert rerun.returncode == 14, rerun.stderr
    # The same error, its paths shown relative to the checkout (the error boundary's way).
    assert f"error: {relative(first.message, bw.ws.root)}" in rerun.stderr
    bump_abort(bw.ws, STACK, "lib")


@pytest.mark.slow
def test_bump_abort_restores_pin_series_and_tree_exactly(bw: BumpWorkspace) -> None:
    build_stack(bw.ws, bw.ws.stack(STACK))
    before = snapshot(bw.ws.root)
    head = git(work_tree(bw), "rev-parse", "HEAD")
    start_bump(bw)
    assert git(work_tree(bw), "rev-parse", "HEAD") != head
    with pytest.raises(MaintenanceError, match="in progress"):
        bump(stack_of(bw.ws, STACK), "lib", "1.4.0")
    with pytest.raises(MaintenanceError, match="bump of this project is in progress"):
        refresh(ResolvedStack.named(bw.ws, STACK), "lib")
    assert status(bw.ws)[0].bump_in_progress == "to 1.3.0"
    result = bump_abort(bw.ws, STACK, "lib")
    assert result.restored_version == "1.2.3"
    assert snapshot(bw.ws.root) == before
    assert git(work_tree(bw), "rev-parse", "HEAD") == head
    assert git(work_tree(bw), "status", "--porcelain") == ""
    assert [b.cached for b in build_stack(bw.ws, bw.ws.stack(STACK))] == [True]
    with pytest.raises(MaintenanceError, match="no bump in progress"):
        bump_abort(bw.ws, STACK, "lib")


@pytest.mark.slow
def test_bump_into_new_stack_leaves_the_source_stack_alone(bw: BumpWorkspace) -> None:
    before = snapshot(bw.ws.root)
    start_bump(bw, new_stack="demo-next")
    (bw.ws.root / ".forks/trees/demo-next/lib/demo_lib/conf.py").write_text("LIMIT = 16\n")
    result = bump_continue(bw.ws, "demo-next", "lib")
    assert result.new_stack_created
    after = snapshot(bw.ws.root)
    assert {k: v for k, v in after.items() if k in before} == before
    stack = bw.ws.stack("demo-next")
    assert not stack.default
    assert stack.project("lib").version == "1.3.0"
    assert stack.project("lib").series == "patches/demo-next/lib"
    assert bw.ws.stack(STACK).project("lib").version == "1.2.3"
    # Aborting a bump into a new stack removes that stack again.
    start_bump(bw, new_stack="demo-other")
    assert (bw.ws.forks_dir / "demo-other.toml").is_file()
    bump_abort(bw.ws, "demo-other", "lib")
    assert not (bw.ws.forks_dir / "demo-other.toml").exists()
    assert not (bw.ws.root / "patches" / "demo-other").exists()


@pytest.mark.slow
def test_applied_upstream_that_disagrees_stops_for_a_human(bw: BumpWorkspace) -> None:
    p2 = bw.series_dir / (bw.series_dir / "series").read_text().split()[1]
    p2.write_text(p2.read_text().replace("Applied-Upstream: 1.3.0, https://example.invalid/pull/2",
                                         "Applied-Upstream: 2.0, https://example.invalid/pull/2"))
    err = start_bump(bw)
    assert "0002-F3-guards" in err.message
    assert "later than 1.3.0" in (err.detail or "")
    # Stopped for a human: the pin stays where it was and the bump waits for a decision.
    assert bw.ws.stack(STACK).project("lib").version == "1.2.3"
    assert status(bw.ws)[0].bump_in_progress == "to 1.3.0"
    bump_abort(bw.ws, STACK, "lib")
    assert bw.ws.stack(STACK).project("lib").version == "1.2.3"


@pytest.mark.slow
def test_bad_input_gives_clear_errors(bw: BumpWorkspace) -> None:
    with pytest.raises(ConfigError, match="unknown stack 'dmeo'"):
        bump(stack_of(bw.ws, "dmeo"), "lib", "1.3.0")
    with pytest.raises(ConfigError, match="unknown project 'lbi'"):
        bump(stack_of(bw.ws, STACK), "lbi", "1.3.0")
    with pytest.raises(MaintenanceError, match=r"demo-lib 9\.9\.9 does not exist on the "
                                               r"package index; newest: 1\.3\.0$"):
        bump(stack_of(bw.ws, STACK), "lib", "9.9.9")
    with pytest.raises(MaintenanceError, match=r"older than the pinned 1\.2\.3"):
        bump(stack_of(bw.ws, STACK), "lib", "1.0.0")
    with pytest.raises(MaintenanceError, match="already pinned"):
        bump(stack_of(bw.ws, STACK), "lib", "1.2.3")
    with pytest.raises(ConfigError, match="neither a PEP 440 version"):
        bump(stack_of(bw.ws, STACK), "lib", "banana!")
    with pytest.raises(MaintenanceError, match=r"git commit of demo-lib 1\.3\.0 is unknown"):
        bump(stack_of(bw.ws, STACK), "lib", "1.3.0")
    assert main(["--root", str(bw.ws.root), "-q", "bump", STACK, "lib", "1.0.0"]) == 14
    assert main(["--root", str(bw.ws.root), "-q", "bump", "nope", "lib", "1.3.0"]) == 2
    assert not (bw.ws.state_dir / "bump").exists()


# --------------------------------------------------------------------------- refresh
@pytest.fixture
def demo(tmp_path: Path) -> DemoWorkspace:
    d = make_demo(tmp_path)
    build_stack(d.ws, d.ws.stack("demo"))
    return d


def mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(directory.iterdir())}


@pytest.mark.slow
def test_refresh_is_byte_stable_and_reports_changes(demo: DemoWorkspace) -> None:
    lib = demo.series_dir("lib")
    refresh(ResolvedStack.named(demo.ws, "demo"), "lib")  # into the canonical form
    stamps = mtimes(lib)
    again = refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    assert not again.wrote_anything
    assert len(again.unchanged) == 2
    assert mtimes(lib) == stamps
    stack = demo.ws.stack("demo")
    work = demo.ws.work_tree(stack, stack.project("lib"))
    # Amend the last patch's commit in the fork tree: refresh reports it as changed.
    (work / "demo_lib" / "kernel.cuh").write_text(
        (work / "demo_lib" / "kernel.cuh").read_text() + "// more\n")
    git(work, "commit", "-q", "-a", "--amend", "--no-edit")
    changed = refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    assert changed.changed == ("0002-F3-guards-drop-the-1200-exclusion.patch",)
    assert "+// more" in (lib / changed.changed[0]).read_text()
    assert "Date: Sun, 29 Nov 2026 00:00:00 +0000" in (lib / changed.changed[0]).read_text()
    # A new commit with a DEP-3 header becomes a new patch.
    (work / "demo_lib" / "new.py").write_text("X = 12\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "F9 new: add X\n\nDescription: add X\nOrigin: vendor\n"
        "Forwarded: no\nLast-Update: 2026-11-30\nFingerprint: demo_lib/new.py: X = 12\n")
    added = refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    assert added.added == ("0003-F9-new-add-X.patch",)
    assert (lib / "series").read_text().split()[-1] == "0003-F9-new-add-X.patch"
    assert "Date: Mon, 30 Nov 2026 00:00:00 +0000" in (lib / added.added[0]).read_text()
    # Dropping a commit removes its patch.
    git(work, "reset", "-q", "--hard", "HEAD~1")
    removed = refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    assert removed.removed == ("0003-F9-new-add-X.patch",)
    # And the fork tree is what a build makes: the next build reuses it.
    assert build_stack(demo.ws, stack, only=["lib"])[0].cached is False
    assert build_stack(demo.ws, stack, only=["lib"])[0].cached is True


@pytest.mark.slow
def test_refresh_refuses_uncommitted_changes_and_headerless_commits(demo: DemoWorkspace) -> None:
    lib = demo.series_dir("lib")
    before = {p.name: p.read_bytes() for p in lib.iterdir()}
    stack = demo.ws.stack("demo")
    work = demo.ws.work_tree(stack, stack.project("lib"))
    (work / "demo_lib" / "conf.py").write_text("# wip\n")
    with pytest.raises(DirtyTreeError, match="uncommitted changes"):
        refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    assert (work / "demo_lib" / "conf.py").read_text() == "# wip\n"
    assert main(["--root", str(demo.ws.root), "-q", "refresh", "demo", "lib"]) == 8
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "wip without a header")
    commit = git(work, "rev-parse", "HEAD")
    with pytest.raises(SeriesError) as err:
        refresh(ResolvedStack.named(demo.ws, "demo"), "lib")
    # The commit is named (the patch file it went to is a deleted scratch file).
    assert err.value.what == (f"commit {commit[:12]} ('wip without a header') cannot become "
                              "a patch: DEP-3 header lacks 'Description'")
    assert "sm120fork-refresh-" not in err.value.message
    assert "rebase -i upstream` and reword it" in (err.value.fix or "")
    assert {p.name: p.read_bytes() for p in lib.iterdir()} == before


@pytest.mark.slow
def test_refresh_without_a_fork_tree(tmp_path: Path) -> None:
    d = make_demo(tmp_path)
    with pytest.raises(MaintenanceError, match="no fork tree"):
        refresh(ResolvedStack.named(d.ws, "demo"), "lib")
    write_series(d.series_dir("app"), (d.series_dir("app") / "series").read_text().split())


@pytest.mark.slow
def test_bump_killed_while_unpacking_the_new_upstream_resumes(bw: BumpWorkspace) -> None:
    start_bump(bw)
    # What a SIGKILL during the new tree's creation leaves: state without a head.
    state_file = bw.ws.state_dir / "bump" / f"{STACK}--lib" / "state.json"
    state = json.loads(state_file.read_text())
    state.update(head="", next_index=0, results=[], conflict_head="", conflict_evidence=[])
    state_file.write_text(json.dumps(state))
    shutil.rmtree(work_tree(bw))
    err = start_bump(bw)  # re-running the same bump resumes from the start
    assert "0004-S4-conf-larger-limit.patch conflicts" in err.message
    (work_tree(bw) / "demo_lib" / "conf.py").write_text("LIMIT = 16  # sm12x\n")
    result = bump_continue(bw.ws, STACK, "lib")
    assert [c.verdict for c in result.classifications] == [
        UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY, STILL_NEEDED, RESOLVED]


@pytest.mark.slow
def test_without_effect_fields_the_fingerprint_decides(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # 1.3.0 has S3's exact line, but next to a docstring: neither direction applies.
    bw = make_bump_workspace(tmp_path, new_files={
        "{pkg}/util.py": 'def helper():\n    """Two."""\n    return 2  # sm12x\n',
        "{pkg}/conf.py": "LIMIT = 8\n"})
    with package_index([bw.old.sdist, bw.new.sdist], "demo-lib") as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        result = bump(stack_of(bw.ws, STACK), "lib", "1.3.0", git_commit=bw.new.commit)
    verdicts = {c.patch[:4]: (c.verdict, c.evidence) for c in result.classifications}
    assert verdicts["0003"][0] == UPSTREAMED_DIFFERENTLY
    assert "Fingerprint demo_lib/util.py: return 2  # sm12x: present" in verdicts["0003"][1]
    assert "no Applied-Upstream field" in verdicts["0003"][1]
    assert verdicts["0004"][0] == STILL_NEEDED
    assert (bw.series_dir / "series").read_text().split() == ["0001-S4-conf-larger-limit.patch"]


@pytest.mark.slow
def test_bump_to_a_git_commit(bw: BumpWorkspace) -> None:
    # The new release as a commit of the declared upstream repository.
    repo = bw.old.repo
    git(repo, "checkout", "-q", "main")
    for rel in ("__init__.py", "kernel.cuh", "util.py", "conf.py", "_version.py"):
        (repo / "demo_lib" / rel).write_text((bw.new.repo / "demo_lib" / rel).read_text())
    git(repo, "commit", "-q", "-am", "release 1.3.0")
    sha = git(repo, "rev-parse", "HEAD")
    with pytest.raises(MaintenanceError, match="needs --version"):
        bump(stack_of(bw.ws, STACK), "lib", sha)
    with pytest.raises(MaintenanceError, match="conflicts"):
        bump(stack_of(bw.ws, STACK), "lib", sha, version="1.3.0")
    assert git(work_tree(bw), "rev-parse", "upstream") == sha
    (work_tree(bw) / "demo_lib" / "conf.py").write_text("LIMIT = 16  # sm12x\n")
    result = bump_continue(bw.ws, STACK, "lib")
    assert [c.verdict for c in result.classifications] == [
        UPSTREAMED_IDENTICALLY, UPSTREAMED_DIFFERENTLY, STILL_NEEDED, RESOLVED]
    project = bw.ws.stack(STACK).project("lib")
    assert (project.source, project.version, project.git_pin.commit) == ("git", "1.3.0", sha)
    # The declaration's sdist pin follows the version (its file name must name it).
    assert (project.sdist_pin.filename, project.sdist_pin.sha256) == ("demo_lib-1.3.0.tar.gz",
                                                              sha256(bw.new.sdist))
    assert project.git_pin.commit_verified
    assert build_stack(bw.ws, bw.ws.stack(STACK))[0].version == "1.3.0+sm120.1"


@pytest.mark.slow
def test_status_says_what_it_fetches_and_why_or_does_not_fetch(
        bw: BumpWorkspace, capsys: pytest.CaptureFixture[str]) -> None:
    root = ["--root", str(bw.ws.root)]
    assert main([*root, "status", "--no-fetch", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["patches"] == []
    assert row["not_checked"] == ("not checked: the pinned upstream is not here "
                                  "(demo_lib-1.2.3.tar.gz); without --no-fetch status "
                                  "downloads it")
    assert not (bw.ws.sdist_cache / "demo_lib-1.2.3.tar.gz").exists()
    assert main([*root, "status", "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)[0]["patches"]) == 4  # stdout is only the JSON
    assert ("INFO     status: demo/lib was never built here: fetching demo_lib-1.2.3.tar.gz "
            "to check its 4 patch(es) against the pin (once; --no-fetch skips it)\n") in err
    assert main([*root, "status", "--json"]) == 0
    assert "fetching" not in capsys.readouterr().err  # checked once: nothing to fetch now


def test_status_loads_a_stack_whose_pins_disagree_and_says_what_disagrees(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A hand edit (or a bump stopped half-way) can leave pins that disagree: ``status``
    still shows the workspace and names the disagreement; ``build`` of that stack refuses
    it (exit 2), and another stack's commands are not blocked by it."""
    demo = make_demo(tmp_path)
    toml = demo.ws.forks_dir / "demo.toml"
    toml.write_text(toml.read_text().replace('upstream_requires = ["demo-lib==1.2.3"]',
                                             'upstream_requires = ["demo-lib==1.3.0"]'))
    other = toml.read_text().replace('name = "demo"', 'name = "other"').replace(
        "default = true", "default = false").replace('upstream_requires = ["demo-lib==1.3.0"]',
                                                     'upstream_requires = ["demo-lib==1.2.3"]')
    (demo.ws.forks_dir / "other.toml").write_text(other)
    root = ["--root", str(demo.ws.root)]
    assert main([*root, "status", "--no-fetch", "--json"]) == 1
    rows = {(r["stack"], r["project"]): r for r in json.loads(capsys.readouterr().out)}
    (disagree,) = rows["demo", "app"]["pins_disagree"]
    assert "projects.app.upstream_requires[0]" in disagree
    assert "demo-app 0.9.0 requires demo-lib==1.3.0" in disagree
    assert "demo-lib 1.2.3 (projects.lib.version) does not satisfy" in disagree
    assert rows["demo", "lib"]["pins_disagree"] == []
    assert rows["other", "app"]["pins_disagree"] == []
    assert main([*root, "status", "--no-fetch"]) == 1
    assert "pins disagree:" in " ".join(capsys.readouterr().out.split())
    assert main([*root, "-q", "build", "--stack", "demo"]) == 2
    assert demo.ws.stack("other", strict=True).name == "other"
