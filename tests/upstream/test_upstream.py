"""upstream_pr on a built demo workspace: evidence, refusals, the branch, nothing pushed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sm120fork.cli.main import main
from sm120fork.errors import DirtyTreeError, MaintenanceError
from sm120fork.gpu.report import made_from
from sm120fork.package.stack import build_stack
from sm120fork.upstream.pr import commit_message, github_slug, short_subject, upstream_pr

from conftest import git
from helpers_maintain import ENCODED_AUTHOR, hint_commands, reauthor_last_patch, run_hint
from helpers_ws import DemoWorkspace, make_demo

pytestmark = pytest.mark.slow


@pytest.fixture
def demo(tmp_path: Path) -> DemoWorkspace:
    d = make_demo(tmp_path)
    build_stack(d.ws, d.ws.stack("demo"))
    return d


def provenance(root: Path, stack: str = "demo") -> dict[str, Any]:
    """What the evidence writers record: the stack and every wheel of its manifest."""
    manifest = json.loads((root / "wheels" / stack / "manifest.json").read_text())
    docs = [made_from(manifest, {"sha256": w["sha256"]}) for w in manifest["wheels"]]
    return {"stack": manifest["stack"], "made_from": [m for d in docs for m in d["made_from"]]}


def write_evidence(root: Path, *, gpu_status: str = "pass", proof: str = "pass",
                   made: dict[str, dict[str, Any]] | None = None,
                   patch_evidence: str = "compile proof", patch_passed: bool = True,
                   verdicts: bool = True) -> None:
    """verify.json, test-ab.json and bench.json/.md; ``made`` overrides their provenance."""
    origin = provenance(root) if (root / "wheels" / "demo").is_dir() else {}
    made = made or {}
    sm120 = root / "reports" / "sm120" / "demo"
    sm120.mkdir(parents=True, exist_ok=True)
    series = root / "patches" / "demo" / "lib" / "series"
    names = series.read_text().split() if series.is_file() else []
    (sm120 / "verify.json").write_text(json.dumps({"report": {}, "verdicts": [
        {"variant": "patched", "arch": "sm_120a", "status": proof, "reasons": []},
        {"variant": "unpatched", "arch": "sm_120a", "status": "fail",
         "reasons": ["empty lamport kernel bodies"]}] if verdicts else [],
        "patches": [{"project": "lib", "patch": n, "evidence": patch_evidence,
                     "passed": patch_passed} for n in names],
        **made.get("verify", origin)}))
    gpu = root / "reports" / "gpu" / "h200-1x"
    gpu.mkdir(parents=True, exist_ok=True)
    (gpu / "test-ab.json").write_text(json.dumps({
        "title": "NVIDIA H200 x1", "command": "python -m sm120fork.gpu test",
        "primary": "patched", "baseline": "unpatched",
        "environment": {"gpus": ["NVIDIA H200"], "torch": "2.11"},
        "results": {"patched": [{"key": "ws2-t1", "status": gpu_status},
                                {"key": "ws2-t8", "status": "pass"}],
                    "unpatched": [{"key": "ws2-t1", "status": "fail"}]},
        **made.get("test", origin)}))
    (gpu / "bench.json").write_text(json.dumps({"kind": "gpu-bench",
                                                **made.get("bench", origin)}))
    (gpu / "bench.md").write_text("| tokens | fused us |\n|---|---|\n| 1 | 12.0 |\n")


def work_tree(demo: DemoWorkspace) -> Path:
    stack = demo.ws.stack("demo")
    return demo.ws.work_tree(stack, stack.project("lib"))


def test_refuses_naming_every_missing_piece_of_evidence(demo: DemoWorkspace) -> None:
    with pytest.raises(MaintenanceError) as err:
        upstream_pr(demo.ws, "demo", "lib")
    msg = err.value.message
    assert "no SM120 compile proof of stack demo reports/sm120/demo/verify.json (run: " \
        "python -m sm120fork verify-sm120 --stack demo)" in msg
    assert "reports/gpu/*/test-ab.json (on a machine with GPUs, run: python -m sm120fork gpu " \
        "test --stack demo --quick --world-sizes 2)" in msg
    assert not (demo.ws.reports_dir / "upstream").exists()
    assert main(["--root", str(demo.ws.root), "-q", "upstream-pr", "demo", "lib"]) == 14


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
    # The GPU test line counts the patched results and the baseline's (before/after).
    assert ("(`reports/gpu/h200-1x/test-ab.json`, `python -m sm120fork.gpu test`): "
            "patched: 2 pass; baseline unpatched: 1 fail") in text
    assert "| 1 | 12.0 |" in text
    assert "NVIDIA H200" in text
    assert any(c.startswith("gh pr create") for c in pr.commands)
    assert any(" push " in c for c in pr.commands)
    evidence = json.loads((out / "evidence.json").read_text())
    assert "reports/sm120/demo/verify.json" in evidence["evidence_files"]


def test_refuses_failed_tests_and_failed_proof(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root, gpu_status="fail")
    with pytest.raises(MaintenanceError, match=r"GPU tests failed .*1 case\(s\), e\.g\. ws2-t1 "
                                               r"\(once fixed, re-run: python -m sm120fork gpu "
                                               r"test --stack demo --quick --world-sizes 2\)"):
        upstream_pr(demo.ws, "demo", "lib")
    write_evidence(demo.ws.root, proof="fail")
    with pytest.raises(MaintenanceError, match="compile proof fails for patched/sm_120a"):
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
    assert main(["--root", str(demo.ws.root), "-q", "upstream-pr", "demo", "lib"]) == 0
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


def _stale(origin: dict[str, Any], **change: str) -> dict[str, Any]:
    return {**origin, "made_from": [{**m, **change} for m in origin["made_from"]]}


@pytest.mark.parametrize("kind", ["verify", "test", "bench"])
def test_refuses_evidence_of_another_series_or_wheel_and_tells_absence_apart(
        demo: DemoWorkspace, kind: str) -> None:
    origin = provenance(demo.ws.root)
    shown = {"verify": "reports/sm120/demo/verify.json", "test": "reports/gpu/h200-1x/test-ab.json",
             "bench": "reports/gpu/h200-1x/bench.json"}[kind]
    rerun = {"verify": "python -m sm120fork verify-sm120 --stack demo",
             "test": "python -m sm120fork gpu test --stack demo --quick --world-sizes 2",
             "bench": "python -m sm120fork gpu bench --stack demo --quick --world-size 2"
             }[kind]
    cases = {
        "absent": ({}, f"{shown} does not record the stack, series and wheel it was made"),
        "series": (_stale(origin, series_digest="0" * 64),
                   f"{shown} was made from another lib series (digest 000000000000, now "),
        "wheel": (_stale(origin, wheel_sha256="f" * 64),
                  f"{shown} was made from another lib wheel (sha256 ffffffffffff, published "),
    }
    for made, message in cases.values():
        write_evidence(demo.ws.root, made={kind: made})
        if kind == "bench":  # timing is no refusal: the body says there is none, and why
            body = upstream_pr(demo.ws, "demo", "lib").body
            assert "Timing evidence: none of this series" in body
            assert f"Not used: {message}" in body
            assert f"`{rerun}`" in body
            continue
        with pytest.raises(MaintenanceError) as err:
            upstream_pr(demo.ws, "demo", "lib")
        assert message in err.value.message
        assert err.value.message.count(rerun) == 1  # the one command, named once
    write_evidence(demo.ws.root)
    assert upstream_pr(demo.ws, "demo", "lib").commits


def test_evidence_of_another_stack_is_not_this_stacks(demo: DemoWorkspace) -> None:
    other = {**provenance(demo.ws.root), "stack": "other"}
    write_evidence(demo.ws.root, made={"verify": other})
    with pytest.raises(MaintenanceError,
                       match=r"verify\.json was made from stack 'other', not 'demo'"):
        upstream_pr(demo.ws, "demo", "lib")
    # A GPU run of another stack is skipped, and named when nothing of this stack is left.
    write_evidence(demo.ws.root, made={"test": other, "bench": other})
    with pytest.raises(MaintenanceError, match=r"no GPU test results of stack demo's current "
                                               r"series .*test-ab\.json was made from stack "
                                               r"'other'"):
        upstream_pr(demo.ws, "demo", "lib")


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
    assert main(["--root", str(demo.ws.root), "-q", "upstream-pr", "demo", "lib", "--write"]) == 0
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
    # A report at the older single reports/sm120/verify.json is nobody's, even when it
    # names this stack: each stack has its own folder.
    own = demo.ws.root / "reports" / "sm120" / "demo" / "verify.json"
    legacy = own.parents[1] / "verify.json"
    text = own.read_text()
    legacy.write_text(text)
    own.unlink()
    with pytest.raises(MaintenanceError, match=r"no SM120 compile proof of stack demo "
                                               r"reports/sm120/demo/verify\.json"):
        upstream_pr(demo.ws, "demo", "lib")
    own.write_text(text)
    # A GPU run of an older toolkit beside today's is history, not a refusal or evidence.
    old = demo.ws.root / "reports" / "gpu" / "h200-2x"
    old.mkdir()
    (old / "test-ab.json").write_text(json.dumps({"primary": "patched", "results": {}}))
    pr = upstream_pr(demo.ws, "demo", "lib")
    assert "h200-2x" not in pr.body
    assert "reports/gpu/h200-2x/test-ab.json" not in json.loads(
        (pr.out_dir / "evidence.json").read_text())["evidence_files"]


def test_the_body_says_what_the_timing_evidence_is(demo: DemoWorkspace) -> None:
    write_evidence(demo.ws.root)
    bench = demo.ws.root / "reports" / "gpu" / "h200-1x" / "bench.json"
    doc = json.loads(bench.read_text())
    bench.write_text(json.dumps({**doc, "shared": True, "world_size": 2,
                                 "environment": {"gpu_count": 1}}))
    body = upstream_pr(demo.ws, "demo", "lib").body
    assert ("`reports/gpu/h200-1x/bench.md` (not timing evidence: its 2 ranks shared 1 GPU"
            in body)
    assert ("Timing evidence: none of this series (a bench with one rank per GPU; on a "
            "machine with 2 or more GPUs run `python -m sm120fork gpu bench --stack demo "
            "--quick --world-size 2`)") in body
    bench.write_text(json.dumps({**doc, "shared": False, "world_size": 2,
                                 "environment": {"gpu_count": 2}}))
    body = upstream_pr(demo.ws, "demo", "lib").body
    assert "(timing evidence: 2 ranks, one per GPU, 2 GPU(s)):" in body
    assert "Timing evidence: none" not in body


def test_a_published_wheel_that_travelled_as_its_tree_counts_by_its_record(
        demo: DemoWorkspace) -> None:
    from sm120fork.util.files import wheel_record_sha256

    origin = provenance(demo.ws.root)
    lib = next(m for m in origin["made_from"] if m["project"] == "lib")
    record = wheel_record_sha256(demo.ws.stack_wheels("demo") / lib["wheel"])
    assert record
    copy = {**origin, "made_from": [{**lib, "tested_sha256": "e" * 64,
                                     "record_sha256": record}]}
    write_evidence(demo.ws.root, made={"test": copy})
    assert upstream_pr(demo.ws, "demo", "lib").commits
    write_evidence(demo.ws.root, made={"test": _stale(copy, record_sha256="9" * 64)})
    with pytest.raises(MaintenanceError, match=r"tested another lib wheel than the one "
                                               r"published \(RECORD 999999999999"):
        upstream_pr(demo.ws, "demo", "lib")


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
    second = {**lib, "wheel": "second-" + lib["wheel"], "sha256": "5" * 64}
    manifest["wheels"].insert(manifest["wheels"].index(lib) + 1, second)
    manifest_path.write_text(json.dumps(manifest))
    origin = provenance(demo.ws.root)
    tested = {**origin, "made_from": [m for m in origin["made_from"]
                                      if m["wheel_sha256"] == "5" * 64]}
    write_evidence(demo.ws.root, made={"test": tested})
    assert upstream_pr(demo.ws, "demo", "lib").commits


def _layer_report(root: Path, made: dict[str, Any], cases: list[dict[str, Any]],
                  planned: list[str], *, finished: bool = True) -> Path:
    path = root / "reports" / "gpu" / "demo-layer" / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "sglang-layer", "planned": planned,
                                "finished": finished, "cases": cases, **made}))
    return path


def test_an_sglang_pr_needs_the_layer_path_of_todays_series(demo: DemoWorkspace) -> None:
    """SGLang's layer path on a GPU (the fault matrix): of this stack's wheel, every planned
    case passed and none hung; else the refusal names the one command that re-makes it."""
    from sm120fork.upstream.evidence import (
        _layer_runs,
        current_builds,
        published_records,
    )

    ws = demo.ws
    stack = ws.stack("demo")
    project = stack.project("lib")
    manifest = json.loads((ws.stack_wheels("demo") / "manifest.json").read_text())
    current = current_builds(ws, stack, manifest["wheels"])
    records = published_records(ws.stack_wheels("demo"), manifest["wheels"])
    rerun = "python -m sm120fork gpu sglang-layer --stack demo --out reports/gpu/demo-layer"

    def judge() -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
        problems: list[str] = []
        found = _layer_runs(ws, stack, project, current, records, {}, problems)
        return found, problems

    found, problems = judge()
    assert found == []
    assert len(problems) == 1
    assert "no GPU run of SGLang's layer path" in problems[0]
    assert rerun in problems[0]
    origin = provenance(ws.root)
    ok = [{"case": "fused", "passed": True, "hung": False},
          {"case": "one-rank-create-fails", "passed": True, "hung": False}]
    planned = ["fused", "one-rank-create-fails"]
    _layer_report(ws.root, origin, ok, planned)
    found, problems = judge()
    assert problems == []
    assert len(found) == 1
    _layer_report(ws.root, origin, ok[:1], planned, finished=False)
    assert "did not finish: one-rank-create-fails not run" in judge()[1][0]
    hung = [ok[0], {"case": "one-rank-create-fails", "passed": False, "hung": True}]
    _layer_report(ws.root, origin, hung, planned)
    assert "failed in reports/gpu/demo-layer/report.json: one-rank-create-fails (hung)" in \
        judge()[1][0]
    # A folder of a published wheel counts by its RECORD; of another wheel it is history.
    lib = next(m for m in origin["made_from"] if m["project"] == "lib")
    tree = {**origin, "made_from": [{**lib, "tested_sha256": None,
                                     "record_sha256": records[lib["wheel"]]}]}
    _layer_report(ws.root, tree, ok, planned)
    assert judge()[1] == []
    _layer_report(ws.root, _stale(tree, record_sha256="9" * 64), ok, planned)
    found, problems = judge()
    assert found == []
    assert "tested another lib wheel than the one published" in problems[0]


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
