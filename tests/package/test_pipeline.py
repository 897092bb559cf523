"""The build pipeline end to end on tiny real projects (real git, real pypa/build)."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

from sm120fork.errors import ArtifactCheckError, DirtyTreeError, LockError, PatchError
from sm120fork.package.kinds import Options
from sm120fork.package.stack import build_stack
from sm120fork.patch.tree import read_state

from conftest import git, make_patch, write_series
from helpers_ws import STACK, DemoWorkspace, make_demo

pytestmark = pytest.mark.slow


@pytest.fixture
def demo(tmp_path: Path) -> DemoWorkspace:
    return make_demo(tmp_path)


def build(demo: DemoWorkspace, *, force: bool = False, rebuild: bool = False) -> list[str]:
    builds = build_stack(demo.ws, demo.ws.stack(STACK), Options(force=force, rebuild=rebuild))
    return ["cached" if b.cached else "built" for b in builds]


def member(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode()


def test_build_ships_patched_wheels_with_manifest(demo: DemoWorkspace) -> None:
    assert build(demo) == ["built", "built"]
    out = demo.ws.stack_wheels(STACK)
    lib_whl = out / "demo_lib-1.2.3+sm120.1-py3-none-any.whl"
    app_whl = out / "demo_app-0.9.0+sm120.1-py3-none-any.whl"
    assert lib_whl.is_file()
    assert app_whl.is_file()
    assert "return [9, 10, 12]" in member(lib_whl, "demo_lib/__init__.py")
    assert '"1.2.3+sm120.1"' in member(lib_whl, "demo_lib/_version.py")
    assert (out / "constraints.txt").read_text().splitlines()[1:] == [
        "demo-lib==1.2.3+sm120.1", "demo-app==0.9.0+sm120.1"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stack"] == STACK
    lib = manifest["wheels"][0]
    assert lib["upstream_commit"] == demo.lib.commit
    assert lib["source"]["kind"] == "sdist"
    assert [p["name"][:4] for p in lib["patches"]] == ["0001", "0002"]
    assert len(lib["tree"]) == 40
    assert len(lib["sha256"]) == 64
    assert all(r["passed"] for r in lib["artifact_check"])
    # The fork tree: first commit is unpatched upstream, then one commit per patch.
    work = demo.ws.work_tree(demo.ws.stack(STACK), demo.ws.stack(STACK).project("lib"))
    log = git(work, "log", "--format=%s", "--reverse").splitlines()
    assert log == ["Upstream demo-lib 1.2.3", "F1 gate: allow 12",
                   "F3 guards: drop the 1200 exclusion"]


def test_second_build_is_cached_and_one_series_change_rebuilds_one(demo: DemoWorkspace) -> None:
    build(demo)
    stack = demo.ws.stack(STACK)
    state_files = [demo.ws.work_tree(stack, p) / ".git" / "sm120fork-state.json"
                   for p in stack.projects]
    before = [f.stat().st_mtime_ns for f in state_files]
    assert build(demo) == ["cached", "cached"]
    assert [f.stat().st_mtime_ns for f in state_files] == before  # no fork tree touched
    app_dir = demo.series_dir("app")
    p = make_patch(demo.app.repo, app_dir, "S2 more", {
        "demo_app/__init__.py": ("def supported", "SM12X_AUTO = 2\n\n\ndef supported")},
        "demo_app/__init__.py: SM12X_AUTO = 2")
    write_series(app_dir, [*(app_dir / "series").read_text().split(), p.name])
    assert build(demo) == ["cached", "built"]


def test_a_cache_entry_of_another_form_is_rebuilt_and_replaced(demo: DemoWorkspace) -> None:
    """An entry that is not ``{"wheels": [...]}`` (one entry bare, as an older toolkit
    wrote it) is a miss: the project is built again and its entry rewritten."""
    build(demo)
    stack = demo.ws.stack(STACK)
    [entry] = (demo.ws.build_cache(stack, stack.project("lib"))).glob("*/entry.json")
    entry.write_text(json.dumps(json.loads(entry.read_text())["wheels"][0]))
    assert build(demo) == ["built", "cached"]
    assert "wheels" in json.loads(entry.read_text())
    assert build(demo) == ["cached", "cached"]


def test_patch_needing_fuzz_stops_naming_patch_file_hunk(demo: DemoWorkspace) -> None:
    build(demo)
    stack = demo.ws.stack(STACK)
    work = demo.ws.work_tree(stack, stack.project("lib"))
    head_before = git(work, "rev-parse", "HEAD")
    before = {p.name: p.read_bytes() for p in demo.ws.stack_wheels(STACK).iterdir()}
    lib_dir = demo.series_dir("lib")
    patch = lib_dir / (lib_dir / "series").read_text().split()[0]
    text = patch.read_text()
    assert "-    return [9, 10]\n" in text
    patch.write_text(text.replace("-    return [9, 10]\n", "-    return [9, 10, 11]\n"))
    with pytest.raises(PatchError) as err:
        build(demo)
    msg = str(err.value)
    assert "stack demo, project lib" in msg
    assert patch.name in msg
    assert "demo_lib/__init__.py" in msg
    assert "hunk #1 `@@ -" in msg
    assert f"`python -m sm120fork refresh {STACK} lib`" in (err.value.fix or "")
    # the dry run failed first: the tree keeps its last good state, wheels/ intact
    assert git(work, "rev-parse", "HEAD") == head_before
    assert git(work, "status", "--porcelain") == ""
    assert {p.name: p.read_bytes() for p in demo.ws.stack_wheels(STACK).iterdir()} == before


def test_patch_for_missing_file(demo: DemoWorkspace) -> None:
    lib_dir = demo.series_dir("lib")
    patch = lib_dir / (lib_dir / "series").read_text().split()[0]
    patch.write_text(patch.read_text().replace("demo_lib/__init__.py", "demo_lib/gone.py"))
    with pytest.raises(PatchError, match=r"gone\.py"):
        build(demo)


def test_fingerprint_that_never_reaches_the_wheel_fails(demo: DemoWorkspace) -> None:
    lib_dir = demo.series_dir("lib")
    p = make_patch(demo.lib.repo, lib_dir, "T1 tests only", {
        "tests/test_x.py": ("pass", "assert True  # sm12x")}, "tests/test_x.py: # sm12x")
    write_series(lib_dir, [*(lib_dir / "series").read_text().split(), p.name])
    with pytest.raises(ArtifactCheckError, match="missing from the wheel"):
        build(demo)
    assert not demo.ws.stack_wheels(STACK).exists()


def test_fingerprint_already_upstream_fails(demo: DemoWorkspace) -> None:
    lib_dir = demo.series_dir("lib")
    patch = lib_dir / (lib_dir / "series").read_text().split()[0]
    text = patch.read_text()
    patch.write_text(text.replace("Fingerprint: demo_lib/__init__.py: return [9, 10, 12]",
                                  "Fingerprint: demo_lib/__init__.py: return [9, 10"))
    with pytest.raises(ArtifactCheckError, match="already present in unpatched upstream"):
        build(demo)


def test_local_changes_are_never_reset_without_force(demo: DemoWorkspace) -> None:
    build(demo)
    stack = demo.ws.stack(STACK)
    work = demo.ws.work_tree(stack, stack.project("lib"))
    (work / "demo_lib" / "__init__.py").write_text("# my work in progress\n")
    lib_dir = demo.series_dir("lib")
    first, second = (lib_dir / "series").read_text().split()
    (lib_dir / second).unlink()
    write_series(lib_dir, [first])
    with pytest.raises(DirtyTreeError, match="uncommitted changes"):
        build(demo)
    assert (work / "demo_lib" / "__init__.py").read_text() == "# my work in progress\n"
    assert build(demo, force=True) == ["built", "cached"]


def test_interrupted_apply_recovers(demo: DemoWorkspace) -> None:
    build(demo)
    stack = demo.ws.stack(STACK)
    project = stack.project("lib")
    work = demo.ws.work_tree(stack, project)
    state = read_state(work)
    assert state is not None
    # Simulate a run killed after the first `git am`: HEAD moved, state incomplete.
    git(work, "reset", "-q", "--hard", "HEAD~1")
    (work / ".git" / "sm120fork-state.json").write_text(
        json.dumps({**json.loads((work / ".git" / "sm120fork-state.json").read_text()),
                    "complete": False, "series": "x"}))
    assert build(demo, rebuild=True) == ["built", "built"]
    assert git(work, "rev-parse", "HEAD") == state.head


def test_lock_refuses_second_run(demo: DemoWorkspace) -> None:
    with demo.ws.lock(), pytest.raises(LockError, match="holds the lock"), demo.ws.lock(timeout=0):
        pass


def test_git_source_fetches_only_pinned_commit(demo: DemoWorkspace) -> None:
    toml = demo.ws.forks_dir / f"{STACK}.toml"
    toml.write_text(toml.read_text().replace('source = "sdist"', 'source = "git"', 1))
    assert build(demo)[0] == "built"
    stack = demo.ws.stack(STACK)
    work = demo.ws.work_tree(stack, stack.project("lib"))
    assert git(work, "rev-parse", "upstream") == demo.lib.commit
    manifest = json.loads((demo.ws.stack_wheels(STACK) / "manifest.json").read_text())
    assert manifest["wheels"][0]["source"] == {
        "kind": "git", "digest": demo.lib.commit, "filename": None, "url": str(demo.lib.repo)}


def test_each_project_reports_its_stages_and_the_build_output_live(
        demo: DemoWorkspace) -> None:
    seen: list[tuple[str, str]] = []
    build_stack(demo.ws, demo.ws.stack(STACK),
                Options(stage=lambda p, what: seen.append((p, what))))
    for key in ("lib", "app"):
        mine = [what for p, what in seen if p == key]
        assert mine[0] == "fetching and patching"
        assert mine[-1] == "checking the wheel"
        building = [w for w in mine if w.startswith("building: ")]
        assert any("Successfully built" in w for w in building)  # pypa/build's own lines


def test_run_streams_output_lines() -> None:
    from sm120fork.util.proc import run

    lines: list[str] = []
    done = run([sys.executable, "-c", "import sys; print('one'); print('two', file=sys.stderr)"],
               on_line=lines.append)
    assert lines == ["one", "two"]
    assert done.stdout == "one\ntwo\n"


def test_a_build_is_its_stages_each_taking_the_previous_ones_result(
        demo: DemoWorkspace) -> None:
    """load -> fetch -> build -> check -> stage and publish: the plan (each series read
    once) is passed down; a project whose cached build serves downloads nothing; a
    partial plan publishes nothing."""
    from sm120fork.package import stack as pipeline
    from sm120fork.resolved import ResolvedStack

    resolved = ResolvedStack.named(demo.ws, STACK)
    stack = resolved.stack
    options = Options(jobs=1)
    plan = pipeline.load(resolved, options, ["lib"])
    assert [i.project.key for i in plan.projects] == ["lib"]
    assert not plan.whole
    assert [p.name[:4] for p in plan.projects[0].series.patches] == ["0001", "0002"]
    fetched = pipeline.fetch(plan)
    (sdist,) = fetched.inputs["lib"] or []
    assert sdist.name == stack.project("lib").sdist_pin.filename
    built = pipeline.stage_and_publish(pipeline.check(pipeline.build(fetched)))
    assert [(b.project, b.cached) for b in built.builds] == [("lib", False)]
    assert not demo.ws.stack_wheels(STACK).exists()  # a partial build publishes nothing
    whole = pipeline.load(resolved, options)
    assert pipeline.fetch(whole).inputs["lib"] is None  # its cached build serves
    done = pipeline.stage_and_publish(pipeline.check(pipeline.build(pipeline.fetch(whole))))
    assert [(b.project, b.cached) for b in done.builds] == [("lib", True), ("app", False)]
    assert (demo.ws.stack_wheels(STACK) / "manifest.json").is_file()
