"""upstream_pr on a built demo workspace: evidence, refusals, the branch, nothing pushed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from sm120fork.cli.main import main
from sm120fork.errors import DirtyTreeError, MaintenanceError
from sm120fork.package.stack import build_stack
from sm120fork.patch.series import load_series
from sm120fork.record import Case, Machine, Tested, TestedPatch, TestedWheel, make, write
from sm120fork.upstream.pr import commit_message, github_slug, short_subject, upstream_pr

from conftest import git, isolate_git
from helpers_maintain import (
    ENCODED_AUTHOR,
    count_series_loads,
    hint_commands,
    reauthor_last_patch,
    run_hint,
)
from helpers_ws import DemoWorkspace, copy_demo, make_demo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoWorkspace:
    base = tmp_path_factory.mktemp("built")
    with pytest.MonkeyPatch.context() as mp:
        isolate_git(mp, base)
        d = make_demo(base)
        build_stack(d.ws, d.ws.stack("demo"))
    return d


@pytest.fixture
def demo(built_demo: DemoWorkspace, tmp_path: Path) -> DemoWorkspace:
    """The demo workspace, built (a copy of one build per module and worker)."""
    return copy_demo(built_demo, tmp_path)


def _tested(root: Path, stack: str = "demo") -> Tested:
    """What the stack is today: its patches' ids and the wheels of its manifest."""
    manifest = json.loads((root / "wheels" / stack / "manifest.json").read_text())
    patches = [TestedPatch(project=key, patch=p.name, patch_id=p.patch_id)
               for key in ("lib", "app") if (root / "patches" / stack / key).is_dir()
               for p in load_series(root / "patches" / stack / key).patches]
    return Tested(wheels=tuple(TestedWheel(variant="patched", project=w["project"],
                                           file=w["wheel"], sha256=w["sha256"])
                               for w in manifest["wheels"]), patches=tuple(patches))


def record_of(root: Path, kind: str, cases: list[Case], *, tested: Tested | None = None,
              stack: str = "demo", shared: bool = True, planned: int | None = None) -> Path:
    rec = make(kind=kind, stack=stack, command={
                   "verify-sm120": "nox -s verify_sm120 -- --stack demo",
                   "gpu-test": "python -m sm120fork.gpu test",
                   "sglang-layer": "python -m sm120fork.gpu sglang-layer",
                   "bench": "python -m sm120fork.gpu bench"}[kind],
               created="2026-12-03T17:00:00+00:00", toolkit="0",
               machine=Machine(description="NVIDIA H200 x1", gpus=("NVIDIA H200",),
                               torch="2.11", shared_gpu=shared),
               tested=tested or _tested(root), planned=len(cases) if planned is None else planned,
               cases=tuple(cases))
    return write(rec, root / "reports") / "record.json"


def write_evidence(root: Path, *, gpu_status: str = "pass", proof: str = "pass",
                   tested: dict[str, Tested] | None = None,
                   patch_evidence: str = "compile proof", patch_passed: bool = True,
                   verdicts: bool = True, shared: bool = True) -> None:
    """The verify-sm120, gpu-test and bench records of today's build; ``tested`` overrides
    what a kind of record says it tested."""
    tested = tested or {}
    series = root / "patches" / "demo" / "lib" / "series"
    names = series.read_text().split() if series.is_file() else []
    proof_cases = [Case(id="proof/full series/sm_120a", variant="full series", outcome=proof),
                   Case(id="proof/unpatched/sm_120a", variant="baseline", outcome="fail",
                        detail="empty lamport kernel bodies")] if verdicts else []
    record_of(root, "verify-sm120", [
        *(Case(id=f"lib/{n}", variant="full series",
               outcome="pass" if patch_passed else "fail", detail=patch_evidence)
          for n in names), *proof_cases], tested=tested.get("verify"))
    record_of(root, "gpu-test", [
        Case(id="ws2-t1", variant="patched", outcome=gpu_status, against="fixed"),
        Case(id="ws2-t8", variant="patched", outcome="pass", against="pass-both")],
        tested=tested.get("test"))
    record_of(root, "bench", [Case(id="fused_auto/t1/h4096", variant="patched",
                                   outcome="pass", detail="median 12.0 us")],
              tested=tested.get("bench"), shared=shared)


def work_tree(demo: DemoWorkspace) -> Path:
    stack = demo.ws.stack("demo")
    return demo.ws.work_tree(stack, stack.project("lib"))


def test_refuses_naming_every_missing_piece_of_evidence(demo: DemoWorkspace) -> None:
    with pytest.raises(MaintenanceError) as err:
        upstream_pr(demo.ws, "demo", "lib")
    msg = err.value.message
    assert "no SM120 compile proof of stack demo reports/demo/verify-sm120/record.json (run: " \
        "python -m sm120fork verify-sm120 --stack demo)" in msg
    assert "no GPU test results of stack demo's current build in reports/demo/gpu-test/ (on a " \
        "machine with a GPU, run: python -m sm120fork gpu test --stack demo --quick " \
        "--world-sizes 2; then python -m sm120fork record import DIR)" in msg
    assert not (demo.ws.reports_dir / "upstream").exists()
    assert main(["--root", str(demo.ws.root), "-q", "upstream-pr", "demo", "lib",
                 "--whole-series"]) == 14


def test_prepares_branch_body_and_commands_without_pushing(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root)
    work = work_tree(demo)
    head = git(work, "rev-parse", "HEAD")
    pr = upstream_pr(demo.ws, "demo", "lib")
    assert pr.branch == "sm12x/lib-1.2.3"
    assert len(pr.commits) == 2
    # One commit per patch, messages from the DEP-3 descriptions, on pinned upstream.
    subjects = git(work, "log", "--reverse", "--format=%s", f"upstream..{pr.branch}")
    assert subjects.splitlines() == ["gate: allow 12", "guards: drop the 1200 exclusion"]
    body = git(work, "log", "-1", "--format=%B", pr.branch)
    assert "Fingerprint" not in body
    assert git(work, "rev-parse", f"{pr.branch}^{{tree}}") == git(work, "rev-parse",
                                                                  "HEAD^{tree}")
    # The fork tree itself is untouched; nothing has a remote, nothing was pushed.
    assert git(work, "rev-parse", "HEAD") == head
    assert git(work, "status", "--porcelain") == ""
    assert git(work, "remote") == ""
    out = pr.out_dir
    assert {p.name for p in pr.files} >= {"PR.md", "body.md", "title.txt", "commands.sh",
                                          "evidence.json"}
    assert len(list((out / "patches").glob("*.patch"))) == 2
    text = (out / "body.md").read_text()
    manifest = json.loads((demo.ws.stack_wheels("demo") / "manifest.json").read_text())
    assert manifest["wheels"][0]["sha256"] in text
    assert "sm_120a" in text
    # The GPU test line counts the results and how they compare with the baseline.
    assert ("(`reports/demo/gpu-test/record.json`, `python -m sm120fork.gpu test`): "
            "2 pass; against the baseline: 1 fixed, 1 pass-both") in text
    assert "| fused_auto/t1/h4096 | pass | median 12.0 us |" in text
    assert "NVIDIA H200" in text
    assert any(c.startswith("gh pr create") for c in pr.commands)
    assert any(" push " in c for c in pr.commands)
    evidence = json.loads((out / "evidence.json").read_text())
    assert "reports/demo/verify-sm120/record.json" in evidence["evidence_files"]


def test_refuses_failed_tests_and_failed_proof(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root, gpu_status="fail")
    with pytest.raises(MaintenanceError, match=r"GPU test results failed in "
                                               r"reports/demo/gpu-test/record\.json: "
                                               r"1 case\(s\), e\.g\. ws2-t1 "
                                               r"\(once fixed, re-run: python -m sm120fork gpu "
                                               r"test --stack demo --quick --world-sizes 2\)"):
        upstream_pr(demo.ws, "demo", "lib")
    write_evidence(demo.ws.root, proof="fail")
    with pytest.raises(MaintenanceError, match="compile proof fails for full series/sm_120a"):
        upstream_pr(demo.ws, "demo", "lib")


def test_refuses_a_dirty_tree_and_a_stale_wheel(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root)
    work = work_tree(demo)
    (work / "demo_lib" / "__init__.py").write_text("# wip\n")
    with pytest.raises(DirtyTreeError) as err:
        upstream_pr(demo.ws, "demo", "lib")
    # The hint's "set them aside" command works as printed and clears the way.
    stash = next(c for c in hint_commands(err.value.fix) if c.endswith("stash -u"))
    assert run_hint(stash, demo.ws.root).returncode == 0
    assert upstream_pr(demo.ws, "demo", "lib").commits
    lib = demo.series_dir("lib")
    first = lib / (lib / "series").read_text().split()[0]
    first.write_text(first.read_text().replace("Forwarded: no", "Forwarded: not-needed"))
    with pytest.raises(MaintenanceError, match="does not hold the current series"):
        upstream_pr(demo.ws, "demo", "lib")


def test_nothing_to_submit_when_every_patch_is_upstream(demo: DemoWorkspace,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    lib = demo.series_dir("lib")
    for name in (lib / "series").read_text().split():
        p = lib / name
        p.write_text(p.read_text().replace(
            "Last-Update:", "Applied-Upstream: 1.3.0, https://example.invalid/pull/9\n"
            "Last-Update:", 1))
    pr = upstream_pr(demo.ws, "demo", "lib")
    assert not pr.commits
    assert "Applied-Upstream" in pr.reason
    assert main(["--root", str(demo.ws.root), "-q", "upstream-pr", "demo", "lib",
                 "--whole-series"]) == 0
    assert "nothing to submit" in capsys.readouterr().out


def test_onto_a_newer_upstream_ref(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root)
    (demo.lib.repo / "NEWS").write_text("1.2.4\n")
    git(demo.lib.repo, "checkout", "-q", "main")
    git(demo.lib.repo, "add", "-A")
    git(demo.lib.repo, "commit", "-q", "-m", "newer upstream")
    newer = git(demo.lib.repo, "rev-parse", "main")
    pr = upstream_pr(demo.ws, "demo", "lib", onto="main", repo=str(demo.lib.repo))
    work = work_tree(demo)
    assert pr.base == newer
    assert git(work, "rev-parse", f"{pr.branch}~2") == newer
    assert not any("source import" in c for c in pr.commands)


def test_message_helpers() -> None:
    assert github_slug("https://github.com/flashinfer-ai/flashinfer.git") == \
        "flashinfer-ai/flashinfer"
    assert github_slug("git@github.com:sgl-project/sglang.git") == "sgl-project/sglang"

    class P:
        subject = "F1 jit: build the comm module"
        description = "Let it build.\n More text."

        def field(self, name: str) -> str:
            return "https://example.invalid/1" if name == "Bug-Upstream" else ""

    p = P()
    assert short_subject(p) == "jit: build the comm module"  # type: ignore[arg-type]
    assert commit_message(p) == (  # type: ignore[arg-type]
        "jit: build the comm module\n\nLet it build.\n More text.\n\n"
        "Bug: https://example.invalid/1\n")


def test_wheels_of_a_non_default_stack_come_from_wheels_dir(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root)
    elsewhere = demo.ws.root / "elsewhere"
    demo.ws.stack_wheels("demo").rename(elsewhere)
    with pytest.raises(MaintenanceError, match=r"no wheels/demo/manifest\.json"):
        upstream_pr(demo.ws, "demo", "lib")
    pr = upstream_pr(demo.ws, "demo", "lib", wheels_dir=elsewhere)
    assert "`elsewhere/manifest.json`" in pr.body


def test_encoded_subject_and_author_reach_the_commits_and_title(tmp_path: Path) -> None:
    d = make_demo(tmp_path)
    reauthor_last_patch(d.lib.repo, d.series_dir("lib"), "F3 Jürgen: drop the guard")
    build_stack(d.ws, d.ws.stack("demo"))
    write_evidence(d.ws.root)
    pr = upstream_pr(d.ws, "demo", "lib")
    assert pr.commits[-1].endswith(" Jürgen: drop the guard")
    assert pr.title == "SM120/SM121 support: 2 fixes (gate, Jürgen)"
    name, email = ENCODED_AUTHOR
    assert git(work_tree(d), "log", "-1", "--format=%an <%ae>%n%s", pr.branch) == (
        f"{name} <{email}>\nJürgen: drop the guard")
    assert "=?UTF-8?" not in pr.body


@pytest.mark.parametrize("kind", ["verify", "test", "bench"])
def test_refuses_evidence_of_another_change_or_wheel_and_tells_absence_apart(
        demo: DemoWorkspace, kind: str) -> None:
    root = demo.ws.root
    folder = {"verify": "verify-sm120", "test": "gpu-test", "bench": "bench"}[kind]
    shown = f"reports/demo/{folder}/record.json"
    rerun = {"verify": "python -m sm120fork verify-sm120 --stack demo",
             "test": "python -m sm120fork gpu test --stack demo --quick --world-sizes 2",
             "bench": "python -m sm120fork gpu bench --stack demo --quick --world-size 2"
             }[kind]
    today = _tested(root)
    first = today.patches[0]
    changed = dataclasses.replace(today, patches=(
        dataclasses.replace(first, patch_id="0" * 40), *today.patches[1:]))
    other_wheel = dataclasses.replace(today, wheels=tuple(
        dataclasses.replace(w, sha256="f" * 64) for w in today.wheels))
    name = first.patch.removesuffix(".patch")
    cases = {
        "change": (changed, f"{shown} is stale: lib patch(es) changed or added since: {name}"),
        "wheel": (other_wheel, f"{shown} is stale: the lib wheel it ran (sha256 ffffffffffff) "
                               "is not the one built now (wheels/demo/manifest.json: "),
    }
    for made, message in cases.values():
        write_evidence(root, tested={kind: made})
        if kind == "bench":  # timing is no refusal: the body says there is none, and why
            body = upstream_pr(demo.ws, "demo", "lib").body
            assert "Timing evidence: none of this build" in body
            assert f"Not used: {message}" in body
            assert f"`{rerun}`" in body
            continue
        with pytest.raises(MaintenanceError) as err:
            upstream_pr(demo.ws, "demo", "lib")
        assert message in err.value.message
        assert err.value.message.count(rerun) == 1  # the one command, named once
    write_evidence(root)
    assert upstream_pr(demo.ws, "demo", "lib").commits


def test_a_reworded_description_stales_no_evidence(demo: DemoWorkspace) -> None:
    """Issue 29: commentary (Description, Forwarded, Verified-By) is not what was tested;
    after a rebuild the records of the patches' changes still back the PR."""
    write_evidence(demo.ws.root)
    lib = demo.series_dir("lib")
    first = lib / (lib / "series").read_text().split()[0]
    first.write_text(first.read_text().replace("Description: ", "Description: Reworded. ", 1)
                     .replace("Forwarded: no", "Forwarded: not-needed"))
    build_stack(demo.ws, demo.ws.stack("demo"))
    assert upstream_pr(demo.ws, "demo", "lib").commits
    # One changed code line is another change: the records of it are stale, each named
    # with the command that re-makes it.
    first.write_text(first.read_text().replace("+    return [9, 10, 12]",
                                               "+    return [9, 10, 12]  # changed"))
    build_stack(demo.ws, demo.ws.stack("demo"))
    with pytest.raises(MaintenanceError) as err:
        upstream_pr(demo.ws, "demo", "lib")
    msg = err.value.message
    assert "reports/demo/verify-sm120/record.json is stale: lib patch(es) changed" in msg
    assert "python -m sm120fork verify-sm120 --stack demo" in msg
    assert "reports/demo/gpu-test/record.json is stale" in msg
    assert "python -m sm120fork gpu test --stack demo" in msg


def test_evidence_of_another_stack_is_not_this_stacks(demo: DemoWorkspace) -> None:
    root = demo.ws.root
    record_of(root, "verify-sm120", [Case(id="lib/x.patch", variant="full series",
                                          outcome="pass")], stack="other")
    record_of(root, "gpu-test", [Case(id="a", variant="patched", outcome="pass")],
              stack="other")
    with pytest.raises(MaintenanceError) as err:
        upstream_pr(demo.ws, "demo", "lib")
    assert "no SM120 compile proof of stack demo" in err.value.message
    assert "no GPU test results of stack demo's current build" in err.value.message


def test_writes_tracked_reports_only_when_asked_and_says_what_it_left_out(
        demo: DemoWorkspace, capsys: pytest.CaptureFixture[str]) -> None:
    write_evidence(demo.ws.root)
    lib = demo.series_dir("lib")
    first = lib / (lib / "series").read_text().split()[0]
    first.write_text(first.read_text().replace(
        "Last-Update:", "Applied-Upstream: 1.3.0, https://example.invalid/pull/9\nLast-Update:",
        1))
    build_stack(demo.ws, demo.ws.stack("demo"))
    write_evidence(demo.ws.root)
    pr = upstream_pr(demo.ws, "demo", "lib")
    assert pr.out_dir == demo.ws.state_dir / "upstream" / "demo-lib"
    assert not (demo.ws.reports_dir / "upstream").exists()
    assert pr.left_out == (f"{first.name}: Applied-Upstream 1.3.0, "
                           "https://example.invalid/pull/9 (upstream has it)",)
    assert len(pr.commits) == 1
    # verify's per-patch table shows the PR's patches, not the one upstream has
    assert f"| {first.name} |" not in pr.body
    assert "| compile proof | pass |" in pr.body
    assert main(["--root", str(demo.ws.root), "-q", "upstream-pr", "demo", "lib", "--write",
                 "--whole-series"]) == 0
    out = capsys.readouterr().out
    assert f"left out of the branch: {first.name}: Applied-Upstream 1.3.0" in out
    written = demo.ws.reports_dir / "upstream" / "demo-lib"
    assert (written / "body.md").is_file()
    # Portable: no absolute path of this machine in what it wrote.
    for path in written.rglob("*"):
        if path.is_file():
            assert str(demo.ws.root) not in path.read_text(), path
    assert "git -C .forks/trees/demo/lib push" in (written / "commands.sh").read_text()


def test_each_stack_has_its_own_evidence_and_older_runs_are_history(
        demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root)
    # A report of an older toolkit (reports/sm120/<stack>/verify.json) is no record.
    own = demo.ws.root / "reports" / "demo" / "verify-sm120" / "record.json"
    legacy = demo.ws.root / "reports" / "sm120" / "demo" / "verify.json"
    legacy.parent.mkdir(parents=True)
    text = own.read_text()
    legacy.write_text(text)
    own.unlink()
    with pytest.raises(MaintenanceError, match=r"no SM120 compile proof of stack demo "
                                               r"reports/demo/verify-sm120/record\.json"):
        upstream_pr(demo.ws, "demo", "lib")
    own.write_text(text)
    # A GPU run of an older toolkit beside today's is history, not a refusal or evidence.
    old = demo.ws.root / "reports" / "gpu" / "h200-2x"
    old.mkdir(parents=True)
    (old / "test-ab.json").write_text(json.dumps({"primary": "patched", "results": {}}))
    pr = upstream_pr(demo.ws, "demo", "lib")
    assert "h200-2x" not in pr.body
    assert "reports/gpu/h200-2x/test-ab.json" not in json.loads(
        (pr.out_dir / "evidence.json").read_text())["evidence_files"]


def test_the_body_says_what_the_timing_evidence_is(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root)
    body = upstream_pr(demo.ws, "demo", "lib").body
    assert ("`reports/demo/bench/record.json` (not timing evidence: its ranks shared a GPU"
            in body)
    assert ("Timing evidence: none of this build (a bench with one rank per GPU; on a "
            "machine with 2 or more GPUs run `python -m sm120fork gpu bench --stack demo "
            "--quick --world-size 2`)") in body
    write_evidence(demo.ws.root, shared=False)
    body = upstream_pr(demo.ws, "demo", "lib").body
    assert "(timing evidence: one rank per GPU):" in body
    assert "Timing evidence: none" not in body


def test_the_compile_proof_is_required_only_where_a_patch_names_it(
        demo: DemoWorkspace) -> None:
    """Issue 21: a stack whose patches claim CPU checks or GPU runs has no compile proof
    (sglang-0.5.23, flashinfer-0.7.4); its PR stands on verify's per-patch checks."""
    write_evidence(demo.ws.root, verdicts=False)
    with pytest.raises(MaintenanceError, match="names the compile proof but holds no verdicts"):
        upstream_pr(demo.ws, "demo", "lib")
    write_evidence(demo.ws.root, verdicts=False, patch_evidence="CPU behaviour check")
    pr = upstream_pr(demo.ws, "demo", "lib")
    assert "| CPU behaviour check | pass |" in pr.body
    assert "compile proof (the series compiled" not in pr.body
    write_evidence(demo.ws.root, verdicts=False, patch_evidence="CPU behaviour check",
                   patch_passed=False)
    with pytest.raises(MaintenanceError, match="failed its checks"):
        upstream_pr(demo.ws, "demo", "lib")


def test_any_published_wheel_of_a_project_of_several_counts(demo: DemoWorkspace) -> None:
    """SGLang 0.5.23 publishes a wheel per Python and platform: a GPU run of the cp312
    one is of today's build, not 'another wheel' because the manifest lists cp311 first."""
    manifest_path = demo.ws.stack_wheels("demo") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    lib = next(w for w in manifest["wheels"] if w["project"] == "lib")
    second = {**lib, "wheel": lib["wheel"].replace("py3-none-any", "cp312-cp312-linux_x86_64"),
              "sha256": "5" * 64}
    manifest["wheels"].insert(manifest["wheels"].index(lib) + 1, second)
    manifest_path.write_text(json.dumps(manifest))
    today = _tested(demo.ws.root)
    tested = dataclasses.replace(today, wheels=tuple(
        dataclasses.replace(w, sha256="5" * 64, file=second["wheel"])
        for w in today.wheels if w.project == "lib"))
    write_evidence(demo.ws.root, tested={"test": tested})
    assert upstream_pr(demo.ws, "demo", "lib").commits


def test_an_sglang_pr_needs_the_layer_path_of_todays_build(demo: DemoWorkspace) -> None:
    """SGLang's layer path on a GPU (the fault matrix): of this stack's build, every planned
    case passed and none hung; else the refusal names the one command that re-makes it."""
    from sm120fork.standing import Today
    from sm120fork.upstream.evidence import _gather

    ws = demo.ws
    stack = ws.stack("demo")
    rerun = "python -m sm120fork gpu sglang-layer --stack demo"

    def judge() -> tuple[list[tuple[Path, Any]], list[str]]:
        problems: list[str] = []
        found, _ = _gather(ws, stack, "layer", Today.of(ws, stack), "GPU run of SGLang's "
                           "layer path", {}, problems)
        return found, problems

    found, problems = judge()
    assert found == []
    assert len(problems) == 1
    assert "no GPU run of SGLang's layer path of stack demo's current build" in problems[0]
    assert rerun in problems[0]
    ok = [Case(id="fused", variant="patched", outcome="pass"),
          Case(id="one-rank-create-fails", variant="patched", outcome="pass")]
    record_of(ws.root, "sglang-layer", ok)
    found, problems = judge()
    assert problems == []
    assert len(found) == 1
    record_of(ws.root, "sglang-layer", ok[:1], planned=2)
    assert "did not finish: 1 planned case(s) not run" in judge()[1][0]
    hung = [ok[0], Case(id="one-rank-create-fails", variant="patched", outcome="fail",
                        detail="hung")]
    record_of(ws.root, "sglang-layer", hung)
    assert ("failed in reports/demo/sglang-layer/record.json: 1 case(s), e.g. "
            "one-rank-create-fails (hung)") in judge()[1][0]


def test_a_packages_reproducer_is_kept_and_cited_in_the_body(demo: DemoWorkspace) -> None:
    """Issue 19.6: the G6 package's CPU reproducer (script + before/after output, made by
    hand) survives upstream_pr writing the package again, and the body quotes its summary."""
    write_evidence(demo.ws.root)
    folder = demo.ws.reports_dir / "upstream" / "demo-lib" / "reproducer"
    folder.mkdir(parents=True)
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (folder / "summary.txt").write_text("before: one-rank-create-fails: HUNG\n"
                                        "after: one-rank-create-fails: pass\n")
    pr = upstream_pr(demo.ws, "demo", "lib", write=True)
    assert (folder / "run.sh").is_file()
    assert (folder / "summary.txt").is_file()
    assert "`reports/upstream/demo-lib/reproducer/run.sh`" in pr.body
    assert "before: one-rank-create-fails: HUNG\nafter: one-rank-create-fails: pass" in pr.body
    assert all("reproducer" not in p.parts for p in pr.files)
    # Written elsewhere (no --write), the body still cites the committed reproducer.
    assert "reproducer/run.sh" in upstream_pr(demo.ws, "demo", "lib").body


def test_a_project_from_published_wheels_finds_its_upstream_in_another_stacks_pin() -> None:
    """sglang-0.5.23 takes SGLang from published wheels (no git pin): its PR's `gh pr create`
    still names SGLang's repository, from the default stack's pin of the same distribution."""
    from sm120fork.upstream.pr import upstream_url
    from sm120fork.workspace import Workspace

    ws = Workspace(Path(__file__).resolve().parents[2])
    project = ws.stack("sglang-0.5.23").project("sglang")
    assert project.git is None
    assert github_slug(upstream_url(ws, project)) == github_slug(
        ws.stack("sglang-0.5.10").project("sglang").git_pin.url)


def test_an_upstream_pr_reads_the_series_and_the_stack_once(
        demo: DemoWorkspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack, its series and its build's manifest are resolved once and passed down
    (the checks, the evidence, the branch), not read again by name in each step."""
    write_evidence(demo.ws.root)
    loaded = count_series_loads(monkeypatch)
    stacks: list[str] = []
    real_stack = type(demo.ws).stack

    def stack(self: Any, name: str | None = None) -> Any:
        stacks.append(str(name))
        return real_stack(self, name)

    monkeypatch.setattr(type(demo.ws), "stack", stack)
    from sm120fork import manifest as manifest_module

    manifests: list[Path] = []
    real_load = manifest_module.load

    def load(path: Path, **kw: Any) -> Any:
        manifests.append(path)
        return real_load(path, **kw)

    monkeypatch.setattr(manifest_module, "load", load)
    upstream_pr(demo.ws, "demo", "lib")
    series = demo.ws.root / "patches" / "demo"
    assert sorted(loaded) == [series / "app", series / "lib"]  # each once (lib was twice)
    assert stacks == ["demo"]
    assert len(manifests) == 1  # and the build's manifest (it was read twice)
