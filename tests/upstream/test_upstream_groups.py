"""upstream_pr per Upstream-PR group (issue 32): the list, one PR prepared with its tests run
on the upstream tree, a package in upstream's words, the user's identity, --onto."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from sm120fork import record
from sm120fork.cli.main import main
from sm120fork.errors import EXIT_PROBLEMS_FOUND, MaintenanceError
from sm120fork.package.stack import build_stack
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import stack_evidence
from sm120fork.upstream.groups import (
    github_slug,
    judge,
    leaks,
    plan_of,
    prepare,
    upstream_url,
    write_gpu_tests,
)
from sm120fork.upstream.template import short_subject
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

from conftest import git, make_patch, write_series
from helpers_maintain import count_series_loads
from helpers_ws import DemoWorkspace, make_demo

pytestmark = pytest.mark.slow

#: The fork, its patch ids and its stack (not demo-lib, upstream's own name).
OURS = r"(?i)sm120fork|sm12x-fork|\bF[13]\b|(?<![\w-])demo(?![\w-])"
TEST_FILE = "test/unit/test_supported_majors.py"
UNIT_TEST = textwrap.dedent("""\
    import unittest

    import demo_lib


    class TestSupportedMajors(unittest.TestCase):
        def test_twelve_is_supported(self):
            self.assertIn(12, demo_lib.supported_majors())


    if __name__ == "__main__":
        unittest.main()
    """)


def _grouped_demo(tmp_path: Path, *, description_leak: bool = False,
                  unit_test: str = UNIT_TEST, test_file: str = TEST_FILE) -> DemoWorkspace:
    """demo's lib series: a gate patch of PR ``gates`` (worded as upstream would, or naming
    its fork id), a fork-only patch, and an upstream-form unit test of the gate beside it."""
    d = make_demo(tmp_path)
    lib_dir = d.ws.root / "patches" / "demo" / "lib"
    for p in lib_dir.glob("*.patch"):
        p.unlink()
    git(d.lib.repo, "checkout", "-q", "main")
    git(d.lib.repo, "branch", "-q", "-D", "scratch")
    subject = "F1 gate: allow 12" if description_leak else "gate: allow 12"
    p1 = make_patch(d.lib.repo, lib_dir, subject, {
        "demo_lib/__init__.py": ("return [9, 10]", "return [9, 10, 12]")},
        "demo_lib/__init__.py: return [9, 10, 12]", extra_fields="Upstream-PR: gates\n")
    p2 = make_patch(d.lib.repo, lib_dir, "F3 guards: fork only", {
        "demo_lib/kernel.cuh": (" && __CUDA_ARCH__ < 1200", "  // SM12x: guard removed")},
        "demo_lib/kernel.cuh: // SM12x: guard removed")
    text = p2.read_text().replace("Forwarded: no", "Forwarded: not-needed")
    p2.write_text(text)
    write_series(lib_dir, [p1.name, p2.name])
    tests_dir = lib_dir / "upstream-tests"
    t1 = make_patch(d.lib.repo, tests_dir, "test: supported majors include 12",
                    {test_file: ("", unit_test)},
                    f"{test_file}: class TestSupportedMajors(unittest.TestCase):",
                    extra_fields="Upstream-PR: gates\n")
    write_series(tests_dir, [t1.name])
    build_stack(d.ws, d.ws.stack("demo"))
    return d


@pytest.fixture
def identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's git configuration (the tests' global one is empty otherwise)."""
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))


def test_lists_one_pr_per_group_and_says_why_the_rest_goes_in_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _grouped_demo(tmp_path)
    plan = plan_of(ResolvedStack.named(d.ws, "demo"), d.ws.stack("demo").project("lib"))
    assert [p.name for p in plan.prs] == ["gates"]
    assert [p.subject for p in plan.prs[0].patches] == ["gate: allow 12"]
    assert [t.subject for t in plan.prs[0].tests] == ["test: supported majors include 12"]
    assert plan.not_proposed == ("0002-F3-guards-fork-only.patch: fork only "
                                 "(Forwarded: not-needed)",)
    assert main(["--root", str(d.ws.root), "-q", "upstream-pr", "demo"]) == 0
    out = capsys.readouterr().out
    assert "PR gates (lib): 0001-gate-allow-12.patch; tests: " in out
    assert "in no PR (lib): 0002-F3-guards-fork-only.patch: fork only" in out
    assert "in no PR (app): 0001-S1-gate.patch: not grouped for upstream" in out
    assert "demo: 1 upstream PR(s); prepare one: " in out


def test_prepares_one_pr_runs_its_tests_on_the_upstream_tree_and_names_nothing_of_ours(
        tmp_path: Path, identity: None) -> None:
    d = _grouped_demo(tmp_path)
    done = prepare(ResolvedStack.named(d.ws, "demo"), None, "gates", write=True)
    assert done.out == d.ws.state_dir / "upstream" / "demo" / "lib" / "gates"
    names = sorted(p.relative_to(done.out).as_posix() for p in done.files)
    assert names == ["body.md", "patches/0001-gate-allow-12.patch",
                     "patches/0002-test-supported-majors-include-12.patch", "title.txt"]
    # the test ran on upstream + the PR's patches (the fork-only one is not there) and passed
    (run,) = done.runs
    assert (run.ran, run.passed, run.summary) == (True, True, "Ran 1 tests: OK")
    work = d.ws.trees_dir / "demo" / "lib"
    assert "guard removed" not in git(work, "show", f"{done.commits[-1]}:demo_lib/kernel.cuh")
    assert git(work, "log", "-1", "--format=%an <%ae>", done.branch) == \
        "Ada Lovelace <ada@example.org>"
    # the record of what it was tested with, published (and nothing else under reports/)
    assert done.published == d.ws.reports_dir / "demo" / "upstream-pr" / "gates"
    rec = record.read(done.published / "record.json")
    assert (rec.kind, rec.subject, rec.verdict, rec.planned) == ("upstream-pr", "gates",
                                                                "pass", 1)
    plan = plan_of(ResolvedStack.named(d.ws, "demo"), d.ws.stack("demo").project("lib"))
    assert [(p.patch, p.patch_id) for p in rec.tested.patches] == [
        (p.name, p.patch_id) for p in (*plan.prs[0].patches, *plan.prs[0].tests)]
    assert rec.command == command("upstream-pr", "demo", "--pr", "gates")
    assert rec.remake == "nox -s upstream_pr -- demo --pr gates"
    assert sorted(p.name for p in done.published.iterdir()) == ["record.json", "summary.md"]
    # it stands while the PR's patches and tests keep the change it tested
    (mine,) = [s for s in stack_evidence(ResolvedStack.named(d.ws, "demo"))
               if s.kind == "upstream-pr"]
    assert mine.current, mine.message()
    (test_patch,) = (d.ws.root / "patches" / "demo" / "lib" / "upstream-tests").glob("*.patch")
    test_patch.write_text(test_patch.read_text().replace("assertIn(12, demo_lib.supported",
                                                         "assertTrue(12 in demo_lib.supported"))
    (mine,) = [s for s in stack_evidence(ResolvedStack.named(d.ws, "demo"))
               if s.kind == "upstream-pr"]
    assert not mine.current
    assert "lib patch 0001-test-supported-majors-include-12 changed since" in mine.message()
    body = (done.out / "body.md").read_text()
    assert "- [x] Add unit tests" not in body  # not SGLang's template: demo is no project of it
    assert "Ran 1 tests: OK" in body
    # nothing in the package names the fork, a stack, a patch id or this machine
    for path in done.files:
        text = path.read_text()
        assert not re.search(OURS, text), path
        assert str(tmp_path) not in text, path
        assert "/tmp/" not in text, path


def test_a_failing_upstream_test_writes_no_package_unless_asked_and_never_claims_a_pass(
        tmp_path: Path, identity: None, capsys: pytest.CaptureFixture[str]) -> None:
    d = _grouped_demo(tmp_path, unit_test=UNIT_TEST.replace("assertIn(12", "assertIn(13"))
    argv = ["--root", str(d.ws.root), "-q", "upstream-pr", "demo", "lib", "--pr", "gates"]
    assert main(argv) == MaintenanceError.exit_code
    err = capsys.readouterr().err
    assert ("PR gates: no package written, 1 of its 1 test file(s) did not pass: "
            f"{TEST_FILE}: ran: Ran 1 tests: FAILED (failures=1); first: AssertionError: 13 "
            "not found in [9, 10, 12]") in err
    assert "--even-if-failing" in err
    package = d.ws.state_dir / "upstream" / "demo" / "lib" / "gates"
    assert not package.exists()
    assert not package.with_name("gates.partial").exists()
    assert main([*argv, "--even-if-failing"]) == EXIT_PROBLEMS_FOUND
    assert f"ran: python3 {TEST_FILE}: Ran 1 tests: FAILED" in capsys.readouterr().out
    body = (package / "body.md").read_text()
    assert (f"- `python3 {TEST_FILE}` on the patched tree, on a CPU: Ran 1 tests: FAILED "
            "(failures=1); first: AssertionError: 13 not found in [9, 10, 12]") in body
    assert "FAILING" not in body


def test_a_test_that_cannot_run_says_why_in_one_line_and_no_package_is_written(
        tmp_path: Path, identity: None) -> None:
    """Its first error, not "Ran 0 tests: no result"; nothing written, no record published;
    asked to write it anyway, the body says it could not run, not that it ran."""
    d = _grouped_demo(tmp_path, unit_test="import no_such_module\n" + UNIT_TEST)
    with pytest.raises(MaintenanceError) as info:
        prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates", write=True)
    assert (f"{TEST_FILE}: could not run: ModuleNotFoundError: No module named "
            "'no_such_module'") in info.value.what
    assert "lacks" not in (info.value.fix or "")  # demo's tests need no group: no guess
    package = d.ws.state_dir / "upstream" / "demo" / "lib" / "gates"
    assert not package.exists()
    assert not package.with_name("gates.partial").exists()
    assert not (d.ws.reports_dir / "demo" / "upstream-pr").exists()
    done = prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates", even_if_failing=True)
    (run,) = done.runs
    assert (run.outcome, run.summary) == ("error", "ModuleNotFoundError: No module named "
                                                   "'no_such_module'")
    assert done.record is not None
    assert done.record.verdict == "fail"
    body = (done.out / "body.md").read_text()
    assert (f"- `python3 {TEST_FILE}` on the patched tree, on a CPU: could not run: "
            "ModuleNotFoundError: No module named 'no_such_module'") in body
    assert "tested there" not in body
    assert "Ran " not in body


def test_the_printed_push_runs_from_the_checkout_root(
        tmp_path: Path, identity: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Pasted as printed (the fork URL filled in), the push sends the PR's branch from the
    fork tree that holds it, and the body file gh reads is where the command says."""
    d = _grouped_demo(tmp_path)
    assert main(["--root", str(d.ws.root), "-q", "upstream-pr", "demo", "--pr", "gates"]) == 0
    out = capsys.readouterr().out
    (push,) = [line.strip() for line in out.splitlines() if " push " in line]
    (gh,) = [line.strip() for line in out.splitlines() if line.strip().startswith("gh pr")]
    assert str(tmp_path) not in out
    fork = tmp_path / "users-fork.git"
    git(tmp_path, "init", "-q", "--bare", str(fork))
    subprocess.run(push.replace("<your-fork-url>", str(fork)), shell=True, check=True,
                   cwd=d.ws.root, capture_output=True)
    branch = push.rsplit(":", 1)[1]
    work = d.ws.trees_dir / "demo" / "lib"
    assert git(fork, "rev-parse", branch) == git(work, "rev-parse", branch)
    body = shlex.split(gh)[shlex.split(gh).index("--body-file") + 1]
    assert (d.ws.root / body).read_text().startswith("## Description")


def test_requirements_are_what_a_prs_cpu_tests_import(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The repository's own stacks: an SGLang PR with a CPU test needs the probe's group
    (what nox -s upstream_pr installs); a FlashInfer PR's GPU tests, the list and
    --no-tests need nothing."""
    root = Path(__file__).resolve().parents[2]
    group = tomllib.loads((root / "pyproject.toml").read_text())["dependency-groups"]
    base = ["--root", str(root), "-q", "upstream-pr"]
    for args, printed in (
            (["sglang-0.5.23", "--pr", "fusion-fail-closed"], group["sglang-probe"]),
            (["sglang-0.5.23", "--pr", "fusion-fail-closed", "--no-tests"], []),
            (["sglang-0.5.23"], []),
            (["flashinfer-0.7.4", "--pr", "lamport-cluster-split"], [])):
        assert main([*base, *args, "--requirements"]) == 0
        assert capsys.readouterr().out.split() == printed, args


def test_an_upstream_test_of_no_group_is_refused(tmp_path: Path) -> None:
    d = _grouped_demo(tmp_path)
    p1 = d.ws.root / "patches" / "demo" / "lib" / "0001-gate-allow-12.patch"
    p1.write_text(p1.read_text().replace("Upstream-PR: gates", "Upstream-PR: other"))
    with pytest.raises(MaintenanceError, match="no patch of the series belongs to"):
        plan_of(ResolvedStack.named(d.ws, "demo"), d.ws.stack("demo").project("lib"))


def test_refuses_a_package_that_names_a_patch_id(tmp_path: Path, identity: None) -> None:
    d = _grouped_demo(tmp_path, description_leak=True)
    with pytest.raises(MaintenanceError, match=r"fork's own words.*F1") as info:
        prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates")
    assert "Forwarded: not-needed patch on top" in (info.value.fix or "")
    assert not (d.ws.state_dir / "upstream" / "demo" / "lib" / "gates").exists()


def test_refuses_without_a_git_identity_and_says_how_to_set_it(tmp_path: Path) -> None:
    d = _grouped_demo(tmp_path)
    with pytest.raises(MaintenanceError, match=r"user\.name") as info:
        prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates")
    assert 'git config --global user.name "Your Name"' in (info.value.fix or "")


def test_onto_a_ref_of_the_users_upstream_checkout(tmp_path: Path, identity: None) -> None:
    d = _grouped_demo(tmp_path)
    upstream = tmp_path / "users-upstream"
    git(tmp_path, "clone", "-q", "--branch", "main", str(d.lib.repo), str(upstream))
    (upstream / "NEWS").write_text("newer upstream work\n")
    git(upstream, "add", "NEWS")
    git(upstream, "commit", "-q", "-m", "upstream moved on")
    tip = git(upstream, "rev-parse", "HEAD")
    done = prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates", onto="main",
                   repo=str(upstream), out=tmp_path / "pr")
    work = d.ws.trees_dir / "demo" / "lib"
    assert done.base == tip
    assert git(work, "rev-parse", f"{done.branch}~2") == tip
    assert not any("release as published" in c for c in done.commands)
    plain = prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates", out=tmp_path / "pr2",
                    run=False)
    assert "release as published, not on upstream's history" in plain.commands[0]


def test_leaks_names_file_line_and_word(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("fine\nPorts S4 of stack sglang-0.5.10\nsee /work/x\n")
    assert leaks(tmp_path, ["S4", "sglang-0.5.10", "sm120fork"], paths=[]) == [
        "a.md:2: S4, sglang-0.5.10", "a.md:3: a machine path"]


def test_a_prs_gpu_tests_go_to_the_kit_with_what_they_test_and_publish_no_cpu_record(
        tmp_path: Path, identity: None, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_test = "tests/comm/test_supported_majors.py"
    d = _grouped_demo(tmp_path, test_file=gpu_test)
    argv = ["--root", str(d.ws.root), "-q", "upstream-pr", "demo", "--pr", "gates", "--write"]
    assert main(argv) == MaintenanceError.exit_code  # not run, no record: no package
    err = capsys.readouterr().err
    assert f"{gpu_test}: not run: needs a GPU: not run here" in err
    assert "--harness upstream_tests --upstream-pr gates --out DIR" in err
    assert main([*argv, "--even-if-failing"]) == 0
    out = capsys.readouterr().out
    assert f"not run: python -m pytest {gpu_test} -v: needs a GPU" in out
    assert "not published: none of its tests ran here" in out
    assert not (d.ws.reports_dir / "demo" / "upstream-pr").exists()
    # what the offline kit carries: the test file as the PR adds it, and what it tests
    assert write_gpu_tests(ResolvedStack.named(d.ws, "demo"), tmp_path / "kit-tests") == ["gates"]
    folder = tmp_path / "kit-tests" / "gates"
    assert "assertIn(12, demo_lib.supported_majors())" in (folder / gpu_test).read_text()
    data = json.loads((folder / "pr.json").read_text())
    series = plan_of(ResolvedStack.named(d.ws, "demo"), d.ws.stack("demo").project("lib"))
    pr = series.prs[0]
    assert (data["pr"], data["stack"], data["project"], data["files"]) == (
        "gates", "demo", "lib", [gpu_test])
    assert [(p["patch"], p["patch_id"]) for p in data["patches"]] == [
        (p.name, p.patch_id) for p in (*pr.patches, *pr.tests)] + [
        ("0002-F3-guards-fork-only.patch", data["patches"][-1]["patch_id"])]
    assert "0002-F3-guards-fork-only.patch" in data["notes"][0]
    with pytest.raises(MaintenanceError, match="no upstream PR with GPU tests named other"):
        write_gpu_tests(ResolvedStack.named(d.ws, "demo"), tmp_path / "none", ("other",))
    # once the kit's run of the PR as it is comes back, the body cites it (and only then)
    case = f"{gpu_test}::TestSupportedMajors::test_twelve_is_supported"
    gpu_run = record.make(
        kind="upstream-pr", subject="gates", stack="demo", command="sh '<kit demo>/run' "
        "upstream_tests", created="2026-12-03T22:00:00+00:00", toolkit="0",
        machine=record.Machine(description="NVIDIA H200 x1"),
        tested=record.Tested(patches=tuple(record.TestedPatch(**p) for p in data["patches"])),
        planned=2, cases=(record.Case(id=case, variant="patched", outcome="pass",
                                      against="fixed"),
                          record.Case(id=case, variant="unpatched", outcome="fail")))
    published = record.write(gpu_run, d.ws.reports_dir)
    done = prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates", write=True)
    body = (done.out / "body.md").read_text()
    assert (f"- `python -m pytest {gpu_test} -v` on the patched tree, on NVIDIA H200 x1: "
            "1 passed; without this PR 1 of them fail") in body
    assert record.read(published / "record.json") == gpu_run  # not replaced by the CPU's
    # prepared without running its tests, the body cites that run all the same
    quick = prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates", run=False,
                    out=tmp_path / "quick")
    assert (f"- `python -m pytest {gpu_test} -v` on the patched tree, on NVIDIA H200 x1: "
            "1 passed") in (quick.out / "body.md").read_text()


def test_a_stack_without_prs_says_why_and_where_its_prs_are_made(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The repository's own sglang-0.5.10: each patch is upstream already, fork only, or
    Forwarded: no without a PR group; the PRs of both projects come from the newer stacks."""
    repo = Path(__file__).resolve().parents[2]
    assert main(["--root", str(repo), "-q", "upstream-pr", "sglang-0.5.10"]) == 0
    out = capsys.readouterr().out
    assert "sglang-0.5.10: 0 upstream PR(s)\n" in out
    assert ("  no PR from sglang: 3 not grouped for upstream (Forwarded: no, and no "
            "Upstream-PR header), 1 upstream has it; its upstream PRs are made from stack "
            f"sglang-0.5.23 (a newer sglang): `{command('upstream-pr', 'sglang-0.5.23')}`"
            ) in out
    assert "  no PR from flashinfer: 4 fork only, 6 upstream has it; its upstream PRs are " \
           "made from stack flashinfer-0.7.4" in out


@pytest.mark.usefixtures("identity")
def test_a_pr_is_prepared_from_the_stack_resolved_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PR's plan, its tests and the leak check's words come from one read of each
    series (the lib series was read twice, once for the plan and once for the words)."""
    d = _grouped_demo(tmp_path)
    loaded = count_series_loads(monkeypatch)
    prepare(ResolvedStack.named(d.ws, "demo"), "lib", "gates", run=False)
    series = d.ws.root / "patches" / "demo"
    assert sorted(loaded) == [series / "app", series / "lib", series / "lib" / "upstream-tests"]


def test_message_helpers() -> None:
    assert github_slug("https://github.com/flashinfer-ai/flashinfer.git") == \
        "flashinfer-ai/flashinfer"
    assert github_slug("git@github.com:sgl-project/sglang.git") == "sgl-project/sglang"

    class P:
        subject = "F1 jit: build the comm module"

    assert short_subject(P()) == "jit: build the comm module"  # type: ignore[arg-type]


def test_a_project_from_published_wheels_finds_its_upstream_in_another_stacks_pin() -> None:
    """sglang-0.5.23 takes SGLang from published wheels (no git pin): its PR's `gh pr create`
    still names SGLang's repository, from the default stack's pin of the same distribution."""
    ws = Workspace(Path(__file__).resolve().parents[2])
    project = ws.stack("sglang-0.5.23").project("sglang")
    assert project.git is None
    assert github_slug(upstream_url(ws, project)) == github_slug(
        ws.stack("sglang-0.5.10").project("sglang").git_pin.url)


def test_a_run_is_judged_by_what_it_ran_and_its_first_error() -> None:
    """Every test skipped proves nothing; a chained traceback's first error is its cause."""
    skipped = judge("test/x.py", "ss\nRan 2 tests in 0.001s\n\nOK (skipped=2)\n", 0)
    assert (skipped.outcome, skipped.summary) == ("error", "Ran 2 tests: OK (skipped=2)")
    chained = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n    import torch\n"
               "ModuleNotFoundError: No module named 'torch'\n\nDuring handling of the above "
               "exception, another exception occurred:\n\nTraceback (most recent call last):\n"
               "RuntimeError: probe failed\n")
    crashed = judge("test/x.py", chained, 1)
    assert (crashed.outcome, crashed.summary) == ("error", "ModuleNotFoundError: No module "
                                                           "named 'torch'")
    assert judge("test/x.py", "", -9).summary == "exit status -9, no output"


def test_an_upstream_test_file_runs_with_gpu_and_test_utility_packages_stubbed(
        tmp_path: Path) -> None:
    test = tmp_path / "test_x.py"
    test.write_text("import datasets, sgl_kernel\nraise SystemExit(3)\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "sm120fork.harness.fake_gpu", str(test)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 3, done.stderr
