"""``watch`` (issue 41 item 5): every release newer than a pin, bumped in a scratch copy of
the checkout, with each patch's verdict, the pins it moves, the claims to re-make and the
commands to run; nothing tracked changes.

The stack is shaped like ``sglang-0.5.23`` (wheel sources, FlashInfer pinned by SGLang's
metadata); the releases are wheels made here, served by a local package index.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from sm120fork.cli.main import main
from sm120fork.maintain.bump import bump
from sm120fork.maintain.state import (
    DROPPED_BY_HAND,
    MERGED_3WAY,
    MERGED_FAILS_CHECK,
    STILL_NEEDED,
    Classification,
)
from sm120fork.maintain.watch import APPLIES, CONFLICTS, MERGES, _verdicts, watch_release
from sm120fork.patch.series import load_series
from sm120fork.record import Case, Machine, Tested, TestedPatch, TestedWheel, make, write
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import claim_standings
from sm120fork.util.files import sha256_file
from sm120fork.workspace import Workspace

from conftest import make_patch, write_series
from helpers_maintain import (
    git_release,
    pack_release,
    package_index,
    sglang_toml,
    sglang_toolkit,
    stack_of,
)

STACK = "sg"
GATE_FILE = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
GATE = "def fused_allowed(major):\n    return major in (9, 10)\n"
FIVE = "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n"
NAMES = "def old_name():\n    return 1\n\n\nA = 1\nB = 2\nC = 3\nD = 4\nE = 5\n"


def _sglang(version: str, **changed: str) -> dict[str, str]:
    files = {"sglang/__init__.py": f'__version__ = "{version}"\n', GATE_FILE: GATE,
             "sglang/srt/five.py": FIVE, "sglang/srt/conf.py": "LIMIT = 8\n",
             "sglang/srt/fix.py": "X = 0\n", "sglang/srt/names.py": NAMES}
    return {**files, **changed}


def _toml(sglang: Path, flashinfer: Path) -> str:
    return sglang_toml(STACK, sglang, flashinfer, requires_dist="flashinfer_python==0.7.2",
                       description="sglang 0.5.23 + flashinfer-python 0.7.2")


def _series(root: Path, tmp_path: Path) -> None:
    """sglang: G1 (from sglang_toolkit, with a claim) and three more, each meeting 0.5.24
    differently; flashinfer: F1, which applies on every FlashInfer release."""
    repo = tmp_path / "sglang-repo"
    d = root / "patches" / STACK / "sglang"
    names = (d / "series").read_text().split()
    for subject, rel, old, new in (
            ("G2 five: b is 20", "five.py", "b = 2", "b = 20  # sm12x"),
            ("G3 conf: larger limit", "conf.py", "LIMIT = 8", "LIMIT = 16  # sm12x"),
            ("G4 fix: X is 1", "fix.py", "X = 0", "X = 1  # sm12x"),
            ("G5 names: B from old_name", "names.py", "B = 2", "B = old_name()  # sm12x")):
        names.append(make_patch(repo, d, subject, {f"python/sglang/srt/{rel}": (old, new)},
                                f"python/sglang/srt/{rel}: {new}").name)
    write_series(d, names)
    fi_repo = git_release(tmp_path / "flashinfer-repo", {"flashinfer/__init__.py": "X = 0\n"},
                          "release 0.7.2")
    fi = root / "patches" / STACK / "flashinfer"
    patch = make_patch(fi_repo, fi, "F1 comm: allow 12", {
        "flashinfer/__init__.py": ("X = 0", "X = 1  # sm12x")}, "flashinfer/__init__.py: X = 1")
    write_series(fi, [patch.name])


def _verified(ws: Workspace, wheel: Path) -> None:
    """A passing verify-sm120 record of the stack as it is (G1's claim is current)."""
    tested = Tested(
        wheels=(TestedWheel(variant="patched", project="sglang", file=wheel.name,
                            sha256=sha256_file(wheel)),),
        patches=tuple(TestedPatch(project=p.key, patch=patch.name, patch_id=patch.patch_id)
                      for p in ws.stack(STACK).projects
                      for patch in load_series(ws.series_dir(p)).patches))
    cases = tuple(Case(id=f"{t.project}/{t.patch}", variant="full series", outcome="pass")
                  for t in tested.patches)
    write(make(kind="verify-sm120", stack=STACK, command="nox -s verify_sm120", toolkit="0",
               created="2026-12-07T05:00:00+00:00", machine=Machine(description="test"),
               tested=tested, planned=len(cases), cases=cases), ws.reports_dir)
    assert [c.state for c in claim_standings(ResolvedStack.named(ws, STACK))] == ["current"]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> Iterator[Path]:
    """sglang 0.5.23 (pinned), 0.5.24 (pins flashinfer 0.7.3; G2's context changed, G3's
    line changed, G4 merged) and 0.5.25 (its gate moved to another layout's file);
    FlashInfer 0.7.2 (pinned), 0.7.2.post1 and 0.7.3 (its ``__init__.py``: the param,
    by default 0.7.2's, so F1 applies)."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-12-07")
    made = tmp_path / "made"
    made.mkdir()
    fi = {v: pack_release(made, "flashinfer-python", v, {"flashinfer/__init__.py": init}, [])
          for v, init in (("0.7.2", "X = 0\n"), ("0.7.2.post1", "X = 0\n"),
                          ("0.7.3", getattr(request, "param", "X = 0\n")))}
    moved = _sglang("0.5.25", **{"sglang/srt/layers/communicator.py": GATE})
    del moved[GATE_FILE]
    sglang = {
        "0.5.23": pack_release(made, "sglang", "0.5.23", _sglang("0.5.23"),
                               ["flashinfer_python==0.7.2"]),
        "0.5.24": pack_release(made, "sglang", "0.5.24", _sglang("0.5.24", **{
            "sglang/srt/five.py": FIVE.replace("e = 5", "e = 50"),
            "sglang/srt/conf.py": "LIMIT = 4\n",
            "sglang/srt/fix.py": "X = 1  # sm12x\n",
            "sglang/srt/names.py": NAMES.replace("old_name", "new_name").replace("E = 5",
                                                                               "E = 50")}),
            ["flashinfer_python==0.7.3"]),
        "0.5.25": pack_release(made, "sglang", "0.5.25", moved, ["flashinfer_python==0.7.2"]),
    }
    checkout = sglang_toolkit(tmp_path, STACK, _toml(sglang["0.5.23"], fi["0.7.2"]),
                              _sglang("0.5.23"), GATE_FILE,
                              extra_fields="Verified-By: sglang:G1\n")
    _series(checkout, tmp_path)
    _verified(Workspace(checkout), sglang["0.5.23"])
    with package_index(list(sglang.values()), "sglang",
                       more={"flashinfer-python": list(fi.values())}) as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        yield checkout


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.relative_to(root).as_posix().startswith("reports/watch/")}


def _rows(release: dict[str, object]) -> list[tuple[str, str, str]]:
    patches = release["patches"]
    assert isinstance(patches, list)
    return [(p["project"], p["patch"][5:7], p["verdict"]) for p in patches]


@pytest.mark.slow
def test_the_watch_reports_every_newer_release_with_its_verdicts_and_changes_nothing(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _files(root)
    assert main(["--root", str(root), "watch", "--json", "--limit", "2"]) == 0
    out, err = capsys.readouterr()
    (report,) = json.loads(out)
    assert _files(root) == before  # forks/, patches/, reports/ and .forks/ untouched
    assert not (root / ".forks" / "trees").exists()
    assert json.loads((root / "reports/watch/sg.json").read_text()) == report
    flashinfer, sglang = report["projects"]
    assert sglang["newer"] == ["0.5.25", "0.5.24"]
    moved, carried = sglang["releases"]
    assert moved["outcome"] == "refused"
    assert "the gate moved: sglang 0.5.25 has no " + GATE_FILE in moved["error"]
    assert carried["version"] == "0.5.24"
    assert carried["outcome"] == "stops"
    assert _rows(carried) == [("flashinfer", "F1", "applies"), ("sglang", "G1", "applies"),
                              ("sglang", "G2", MERGES),
                              ("sglang", "G3", "conflicts"),
                              ("sglang", "G4", "upstream has it"),
                              ("sglang", "G5", "merged, fails its check")]
    g5 = carried["patches"][-1]["evidence"]
    assert any("NameError: name 'old_name' is not defined" in e for e in g5), g5
    assert carried["moves"] == [
        "flashinfer 0.7.2 -> 0.7.3 (sglang 0.5.24 requires flashinfer_python==0.7.3)"]
    # G1's claim holds today; its record ran 0.5.23, so the bump stales it.
    (claim,) = carried["claims"]
    assert claim == ["patches/sg/sglang/0001-G1-layer_boundary-allow-the-fused-path-on-12: "
                     "sglang:G1", claim[1]]
    assert claim[1].startswith("stale: ")
    assert "but sglang is pinned at 0.5.24 now" in claim[1]
    assert [s["run"] for s in carried["steps"]] == [
        "python -m sm120fork bump sg sglang 0.5.24",
        "python -m sm120fork bump sg sglang --continue",
        "python -m sm120fork bump sg sglang --continue",
        "python -m sm120fork build --stack sg",
        "nox -s verify_sm120 -- --stack sg"]  # as the record's kind names it
    assert carried["steps"][1]["why"].startswith(
        "once 0003-G3-conf-larger-limit.patch (sglang) is resolved in its fork tree; ")
    assert carried["steps"][2]["why"].startswith(
        "once 0005-G5-names-B-from-old_name.patch (sglang) is mended in its fork tree (it "
        "merged, but 0005-G5-names-B-from-old_name.patch: python/sglang/srt/names.py:6: "
        "NameError: name 'old_name' is not defined")
    # FlashInfer's releases: SGLang pins it, so each goes into a stack of its own.
    assert flashinfer["newer"] == ["0.7.3", "0.7.2.post1"]
    newest = flashinfer["releases"][0]
    assert newest["new_stack"] == "flashinfer-0.7.3"
    assert (newest["outcome"], _rows(newest)) == ("bumps", [("flashinfer", "F1", "applies")])
    assert newest["steps"][0]["run"] == (
        "python -m sm120fork bump sg flashinfer 0.7.3 --new-stack flashinfer-0.7.3")
    assert "sglang 0.5.23 requires flashinfer_python==0.7.2" in newest["steps"][0]["why"]
    # The summary: a row per patch; no folder of this machine in either file.
    md = (root / "reports/watch/sg.md").read_text()
    assert "| sglang | 0003-G3-conf-larger-limit.patch | conflicts |" in md
    assert "### 0.5.25: refused: " in md
    for text in (md, json.dumps(report)):
        assert str(root.parent) not in text
        assert "/tmp" not in text
    assert "watch: [1/2] sg/sglang 0.5.23 -> 0.5.25" in err


@pytest.mark.slow
def test_the_limit_bumps_the_newest_releases_and_lists_the_others(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bump(stack_of(Workspace(root), STACK), "flashinfer", "0.7.3", new_stack="flashinfer-0.7.3")
    assert main(["--root", str(root), "watch", "--stack", STACK, "--limit", "1"]) == 0
    out = capsys.readouterr().out
    report = json.loads((root / "reports/watch/sg.json").read_text())
    assert [(p["newer"], [r["version"] for r in p["releases"]]) for p in report["projects"]
            ] == [(["0.7.3", "0.7.2.post1"], ["0.7.3"]), (["0.5.25", "0.5.24"], ["0.5.25"])]
    carried = report["projects"][0]["releases"][0]
    assert (carried["outcome"], carried["error"]) == ("carried",
                                                      "stack flashinfer-0.7.3 carries it")
    assert "sg/sglang 0.5.23: 2 newer release(s)" in out
    md = (root / "reports/watch/sg.md").read_text()
    assert "Newer: 0.5.25, 0.5.24 (not bumped here: 0.5.24)" in md
    first = md
    assert main(["--root", str(root), "watch", "--stack", STACK, "--limit", "1"]) == 0
    assert (root / "reports/watch/sg.md").read_text() == first  # the same run, the same bytes


@pytest.mark.slow
@pytest.mark.parametrize("root", ["X = 2\n"], indirect=True)
def test_a_coordinated_project_that_conflicts_is_judged_and_its_bump_goes_on(
        root: Path, tmp_path: Path) -> None:
    """F1 conflicts with FlashInfer 0.7.3, which sglang 0.5.24 moves the stack to: the
    FlashInfer bump stops first; dropped there, the sglang bump goes on."""
    ws = Workspace(root)
    stack = ws.stack(STACK)
    release = watch_release(ws, stack, stack.project("sglang"), Version("0.5.24"), tmp_path)
    assert [(p.project, p.patch[5:7], p.verdict) for p in release.patches][:2] == [
        ("flashinfer", "F1", CONFLICTS), ("sglang", "G1", APPLIES)]
    assert [s.run for s in release.steps][:3] == [
        "python -m sm120fork bump sg sglang 0.5.24",
        "python -m sm120fork bump sg flashinfer --continue",
        "python -m sm120fork bump sg sglang --continue"]


def test_a_merge_that_fails_its_check_is_reported_as_such_not_as_a_conflict() -> None:
    """The bump stopped at it ("merged, fails its check"); the watch dropped it (--skip),
    which the bump records as dropped by hand: its evidence still says why."""
    row = Classification(patch="0002-G2-x.patch", subject="G2 x", verdict=DROPPED_BY_HAND,
                         evidence=("does not apply, does not reverse-apply", MERGED_3WAY,
                                   f"{MERGED_FAILS_CHECK}: 0002-G2-x.patch: python/x.py:3: "
                                   "NameError: name 'y' is not defined (import x at "
                                   "capability 12.0)",
                                   "conflict resolved by dropping the patch (--skip)"),
                         applied_upstream="")
    merged = dataclasses.replace(row, verdict=STILL_NEEDED, evidence=(
        MERGED_3WAY, "its check passes: compiled 1 Python file(s) the series touches"))
    assert [v.verdict for v in _verdicts("sglang", [row, merged])] == [
        MERGED_FAILS_CHECK, MERGES]
