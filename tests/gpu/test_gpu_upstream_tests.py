"""An upstream PR's own GPU tests on the box (``python -m sm120fork.gpu upstream-tests``,
the kit's ``upstream_tests`` verb): each variant's FlashInfer in its own path, pytest run
with each, and one upstream-pr record per PR whose patched cases say what the fix did."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from sm120fork import record
from sm120fork.errors import ConfigError
from sm120fork.gpu import upstream_tests as ut
from sm120fork.gpu.cli import main
from sm120fork.gpu.core.variants import Variant
from sm120fork.kit import boot
from sm120fork.util import typed

PR = {"pr": "split-fix", "stack": "fi-1.0", "project": "flashinfer",
      "files": ["tests/comm/test_split.py"],
      "patches": [{"project": "flashinfer", "patch": "0002-fix.patch", "patch_id": "1" * 40},
                  {"project": "flashinfer", "patch": "0001-test.patch", "patch_id": "2" * 40}],
      "notes": ["the patched wheel is the stack's build of the PR's patches"]}
TEST_FILE = """\
import pytest

import flashinfer


@pytest.mark.parametrize("hidden", [4096, 4608])
def test_split(hidden):
    assert hidden % flashinfer.CLUSTER == 0 or flashinfer.FIXED


def test_needs_four_gpus():
    pytest.skip("needs 4 GPUs")
"""


def _wheel(folder: Path, version: str, fixed: bool) -> Path:
    """A FlashInfer stand-in: ``FIXED`` says whether its split is the patched one."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"flashinfer_python-{version}-py3-none-any.whl"
    dist = f"flashinfer_python-{version}.dist-info"
    files = {"flashinfer/__init__.py": f"CLUSTER = 4096\nFIXED = {fixed}\n".encode(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: flashinfer-python\n"
                                 f"Version: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    rows = [f"{n},sha256={b64(d)},{len(d)}" for n, d in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}/RECORD", "\n".join(rows) + "\n")
    return path


def _bundle(folder: Path, pr: dict[str, object] | None = None) -> Path:
    data = pr or PR
    target = folder / str(data["pr"])
    (target / "tests" / "comm").mkdir(parents=True)
    (target / "tests" / "comm" / "test_split.py").write_text(TEST_FILE)
    (target / "pytest.ini").write_text("[pytest]\n")
    (target / ut.PR_FILE).write_text(json.dumps(data))
    return folder


@pytest.mark.slow
def test_each_case_of_the_patched_build_says_what_the_fix_did(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tests = _bundle(tmp_path / "upstream-tests")
    patched = _wheel(tmp_path / "stack", "1.0+sm120.1", fixed=True)
    upstream = _wheel(tmp_path / "upstream", "1.0", fixed=False)
    out = tmp_path / "results"
    rc = main(["upstream-tests", "--tests", str(tests), "--wheel-dir", f"patched={patched}",
               "--wheel-dir", f"unpatched={upstream}", "--work-dir", str(tmp_path / "work"),
               "--out", str(out), "--no-compile"])
    assert rc == 0, capsys.readouterr()
    rec = record.read(out / "split-fix" / record.RECORD_FILE)
    assert (rec.kind, rec.subject, rec.stack) == ("upstream-pr", "split-fix", "fi-1.0")
    got = {(c.id, c.variant): (c.outcome, c.against) for c in rec.cases}
    case = "tests/comm/test_split.py::test_split"
    assert got == {
        (f"{case}[4096]", "patched"): ("pass", "pass-both"),
        (f"{case}[4096]", "unpatched"): ("pass", None),
        (f"{case}[4608]", "patched"): ("pass", "fixed"),
        (f"{case}[4608]", "unpatched"): ("fail", None),
        ("tests/comm/test_split.py::test_needs_four_gpus", "patched"): ("skip", None),
        ("tests/comm/test_split.py::test_needs_four_gpus", "unpatched"): ("skip", None)}
    assert (rec.planned, rec.finished, rec.verdict) == (6, True, "pass")
    assert [(w.variant, w.file) for w in rec.tested.wheels] == [
        ("patched", patched.name), ("unpatched", upstream.name)]
    assert [p.patch for p in rec.tested.patches] == ["0002-fix.patch", "0001-test.patch"]
    assert "the patched wheel is the stack's build of the PR's patches" in rec.notes
    assert record.machine_paths(rec) == []
    assert (out / "split-fix" / "patched.log").is_file()


@pytest.mark.slow
def test_a_failing_patched_case_fails_the_run(tmp_path: Path) -> None:
    tests = _bundle(tmp_path / "upstream-tests")
    broken = _wheel(tmp_path / "stack", "1.0+sm120.1", fixed=False)
    out = tmp_path / "results"
    assert main(["upstream-tests", "--tests", str(tests), "--wheel-dir", f"patched={broken}",
                 "--work-dir", str(tmp_path / "work"), "--out", str(out),
                 "--no-compile"]) == 1
    rec = record.read(out / "split-fix" / record.RECORD_FILE)
    assert rec.verdict == "fail"
    assert rec.counts["fail"] == 1


def test_a_run_cut_short_keeps_what_finished_and_is_unfinished() -> None:
    planned = ["tests/comm/test_split.py::test_split[4096]",
               "tests/comm/test_split.py::test_split[4608]"]
    variants = [Variant(name=n, wheel=Path(f"{n}.whl"), sha256=c * 64, site=None,
                           jit_base=Path("jit")) for n, c in (("patched", "a"),
                                                              ("unpatched", "b"))]
    results = {"patched": {ut._case_key(planned[0]): ("pass", "3 s")},
               "unpatched": {ut._case_key(planned[0]): ("fail", "misaligned address")}}
    rec = ut.pr_record(typed.read(ut.PrTests, PR, "pr.json"), planned, results, variants,
                       record.Machine(description="H200 x1"),
                       "sh <kit fi-1.0>/run upstream_tests", [])
    assert (rec.planned, rec.finished, rec.verdict) == (4, False, "unfinished")
    assert [(c.variant, c.against) for c in rec.cases] == [("patched", "fixed"),
                                                           ("unpatched", None)]


def test_junit_outcomes(tmp_path: Path) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.comm.test_x" name="test_a[1]" time="2.4"/>'
        '<testcase classname="tests.comm.test_x" name="test_b"><failure message="assert'
        ' 1 == 2&#10;  more"/></testcase>'
        '<testcase classname="tests.comm.test_x" name="test_c"><skipped message="needs 4'
        ' GPUs"/></testcase>'
        '<testcase classname="tests.comm.test_x" name="test_d"><error message="boom in'
        ' /root/.kit/fi/.box/work/patched/site/flashinfer/comm/x.py:12"/>'
        '</testcase></testsuite></testsuites>')
    assert ut.junit_cases(xml) == [
        ("tests.comm.test_x::test_a[1]", "pass", "2 s"),
        ("tests.comm.test_x::test_b", "fail", "assert 1 == 2 more"),
        ("tests.comm.test_x::test_c", "skip", "needs 4 GPUs"),
        ("tests.comm.test_x::test_d", "error", "boom in <path>")]
    assert ut._case_key("tests/comm/test_x.py::test_a[1]") == "tests.comm.test_x::test_a[1]"


def test_the_kit_runs_the_carried_tests_on_its_patched_and_upstream_wheels(
        tmp_path: Path) -> None:
    data: boot.KitJson = {"stack": "fi-1.0", "patched": {"flashinfer": "stack/fi.whl"},
            "upstream": {"flashinfer": "upstream/fi.whl"}, "upstream_tests": "upstream-tests"}
    cmd, env = boot.harness_command(tmp_path, data, "upstream_tests", ["--", "-k", "4608"],
                                    tmp_path / ".box")
    assert cmd == ["sm120fork.gpu", "upstream-tests", "--tests",
                   str(tmp_path / "upstream-tests"),
                   "--wheel-dir", f"patched={tmp_path / 'stack/fi.whl'}",
                   "--wheel-dir", f"unpatched={tmp_path / 'upstream/fi.whl'}",
                   "--out", "kit-results/fi-1.0/upstream_tests",
                   "--work-dir", str(tmp_path / ".box" / "work"), "--", "-k", "4608"]
    assert env["SM120FORK_COMMAND"] == "sh '<kit fi-1.0>/run' upstream_tests -- -k 4608"
    with pytest.raises(boot.KitError, match="carries no upstream tests"):
        boot.harness_command(tmp_path, {**data, "upstream_tests": None}, "upstream_tests",
                             [], tmp_path / ".box")


def test_names_the_prs_the_kit_carries_when_asked_for_another(tmp_path: Path) -> None:
    tests = _bundle(tmp_path / "upstream-tests")
    with pytest.raises(ConfigError, match=r"PR other.*carried: split-fix"):
        ut.bundles(tests, ["other"])
    assert [d.pr for _, d in ut.bundles(tests)] == ["split-fix"]

