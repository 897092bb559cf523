"""A bump moves a stack as a whole and checks first (issue 31 item 3).

The stack is shaped like ``sglang-0.5.23`` (sglang a ``wheel`` source with a series on the
``layer_boundary`` layout, FlashInfer used as published); the releases are wheels made
here and served by a local package index, no network.
"""

from __future__ import annotations

import textwrap
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import sm120fork.maintain.state as bump_state
from sm120fork.cli.main import main
from sm120fork.errors import MaintenanceError
from sm120fork.maintain.bump import bump, bump_abort, bump_continue
from sm120fork.util.files import sha256_file
from sm120fork.workspace import Workspace

from conftest import git, make_patch, write_series
from helpers_maintain import (
    git_release,
    pack_release,
    package_index,
    sglang_toml,
    sglang_toolkit,
    snapshot,
    stack_of,
    wheel_project,
)

STACK = "sg"
GATE_FILE = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
GATE = "def fused_allowed(major):\n    return major in (9, 10)\n"
MOVED_GATE_FILE = "sglang/srt/layers/communicator.py"


def _sglang_files(version: str, gate_file: str = GATE_FILE) -> dict[str, str]:
    return {"sglang/__init__.py": f'__version__ = "{version}"\n', gate_file: GATE}


def _toml(sglang: Path, flashinfer: Path) -> str:
    return sglang_toml(
        STACK, sglang, flashinfer, requires_dist="flashinfer_python[cu13]==0.7.2",
        description="sglang 0.5.23 + flashinfer-python 0.7.2 (as published)", comments={
            "[stack]": "Today's stack: a comment about sglang 0.5.23 that a new stack must "
                       "not copy.",
            "upstream_requires": "sglang 0.5.23's own Requires-Dist on FlashInfer."})


@dataclass
class Releases:
    ws: Workspace
    flashinfer_073: Path
    flashinfer_072_post1: Path


@pytest.fixture
def rel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Releases]:
    """sglang 0.5.23 (pins flashinfer 0.7.2), 0.5.24 (pins 0.7.3) and 0.5.25 (its gate
    moved to the ``communicator`` layout's file); FlashInfer 0.7.2, 0.7.2.post1, 0.7.3."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-12-01")
    made = tmp_path / "made"
    made.mkdir()
    fi = {v: pack_release(made, "flashinfer-python", v, {"flashinfer/__init__.py": ""}, [])
          for v in ("0.7.2", "0.7.2.post1", "0.7.3")}
    sglang = {
        "0.5.23": pack_release(made, "sglang", "0.5.23", _sglang_files("0.5.23"),
                               ["flashinfer_python[cu13]==0.7.2", "requests"]),
        "0.5.24": pack_release(made, "sglang", "0.5.24", _sglang_files("0.5.24"),
                               ["flashinfer_python[cu13]==0.7.3", "requests"]),
        "0.5.25": pack_release(made, "sglang", "0.5.25",
                               _sglang_files("0.5.25", MOVED_GATE_FILE),
                               ["flashinfer_python[cu13]==0.7.2"]),
    }
    root = sglang_toolkit(tmp_path, STACK, _toml(sglang["0.5.23"], fi["0.7.2"]),
                          _sglang_files("0.5.23"), GATE_FILE)
    with package_index(list(sglang.values()), "sglang",
                       more={"flashinfer-python": list(fi.values())}) as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        yield Releases(ws=Workspace(root), flashinfer_073=fi["0.7.3"],
                       flashinfer_072_post1=fi["0.7.2.post1"])


@pytest.mark.slow
def test_a_new_stack_on_a_release_with_another_flashinfer_pin_moves_flashinfer_too(
        rel: Releases) -> None:
    """One command: sglang 0.5.24 pins flashinfer 0.7.3 in its metadata; the new stack
    pins both, with 0.5.24's own requirement and facts, not 0.5.23's."""
    before = snapshot(rel.ws.root)
    result = bump(stack_of(rel.ws, STACK), "sglang", "0.5.24", new_stack="sg-next")
    assert [c.verdict for c in result.classifications] == ["still needed"]
    assert {k: v for k, v in snapshot(rel.ws.root).items() if k in before} == before
    text = (rel.ws.forks_dir / "sg-next.toml").read_text()
    declared = tomllib.loads(text)
    sglang, flashinfer = declared["projects"]["sglang"], declared["projects"]["flashinfer"]
    assert sglang["version"] == "0.5.24"
    assert sglang["upstream_requires"] == ["flashinfer_python[cu13]==0.7.3"]
    assert sglang["layout"] == "layer_boundary"
    assert flashinfer["version"] == "0.7.3"
    assert flashinfer["wheels"] == [{"filename": rel.flashinfer_073.name,
                                     "sha256": sha256_file(rel.flashinfer_073)}]
    assert declared["stack"]["description"] == (
        "flashinfer-python 0.7.3 (as published) + sglang 0.5.24, SM120/SM121 enabled")
    assert "0.5.23" not in text
    assert "0.7.2" not in text
    stack = rel.ws.stack("sg-next")  # loads, its pins agreeing
    assert stack.project("flashinfer").version == "0.7.3"


@pytest.mark.slow
def test_an_in_place_bump_moves_flashinfer_with_sglang(rel: Releases) -> None:
    bump(stack_of(rel.ws, STACK), "sglang", "0.5.24")
    stack = rel.ws.stack(STACK)
    assert stack.project("flashinfer").version == "0.7.3"
    assert [str(r) for r in stack.project("sglang").upstream_requires] == [
        "flashinfer_python[cu13]==0.7.3"]
    text = stack.path.read_text()
    assert "# sglang 0.5.23's own Requires-Dist on FlashInfer." in text  # comments kept


@pytest.mark.slow
def test_the_bump_says_each_pin_it_moves_and_why(
        rel: Releases, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: the bump moved FlashInfer with sglang and no console line, report or
    CHANGELOG said so."""
    assert main(["--root", str(rel.ws.root), "bump", STACK, "sglang", "0.5.24"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    line = ("flashinfer-python 0.7.2 -> 0.7.3 (as published): sglang 0.5.24 requires "
            "flashinfer_python[cu13]==0.7.3")
    assert f"moved: {line}" in out
    report = rel.ws.reports_dir / "bump" / f"{STACK}-sglang-0.5.23-to-0.5.24.md"
    assert f"- moved: {line}\n" in report.read_text()
    changelog = rel.ws.root / "patches" / STACK / "CHANGELOG.md"
    assert f"- moved {line}\n" in changelog.read_text()


@pytest.mark.slow
def test_a_companion_declared_as_an_sdist_source_is_moved_to_its_published_wheels(
        rel: Releases) -> None:
    """FlashInfer declared as an ``sdist`` source with an empty series ships its published
    wheels; moved with sglang 0.5.24, its new pin is those of 0.7.3 (a ``wheel`` source:
    the sdist, git and version stamp of 0.7.2 pin nothing of 0.7.3).  The bump wrote the
    source kind back with no sdist or git pin, and stopped at its last step: "the new
    pins would not load"."""
    path = rel.ws.forks_dir / f"{STACK}.toml"
    text = path.read_text().replace('source = "wheel"\n', textwrap.dedent(f"""\
        source = "sdist"

        [projects.flashinfer.git]
        url = "https://github.com/flashinfer-ai/flashinfer.git"
        tag = "v0.7.2"
        commit = "{'a' * 40}"

        [projects.flashinfer.sdist]
        filename = "flashinfer_python-0.7.2.tar.gz"
        sha256 = "{'0' * 64}"

        [projects.flashinfer.version_stamp]
        file = "flashinfer/__init__.py"
        """), 1)
    path.write_text(text)
    assert rel.ws.stack(STACK).project("flashinfer").source == "sdist"

    bump(stack_of(rel.ws, STACK), "sglang", "0.5.24")

    flashinfer = rel.ws.stack(STACK).project("flashinfer")
    assert (flashinfer.source, flashinfer.version) == ("wheel", "0.7.3")
    assert [w.filename for w in flashinfer.wheels] == [rel.flashinfer_073.name]
    assert (flashinfer.git, flashinfer.sdist) == (None, None)


def test_a_flashinfer_release_the_stacks_sglang_rejects_is_refused_before_anything(
        rel: Releases) -> None:
    """Before any download (the index is asked only whether the release exists) and
    before any write: both pins and the fix are named."""
    before = snapshot(rel.ws.root)
    with pytest.raises(MaintenanceError) as err:
        bump(stack_of(rel.ws, STACK), "flashinfer", "0.7.2.post1")
    message = err.value.message
    assert "flashinfer-python 0.7.2.post1 would break the stack's pins" in message
    assert "sglang 0.5.23 requires flashinfer_python[cu13]==0.7.2" in message
    assert "projects.sglang.upstream_requires[0]" in message
    assert "python -m sm120fork bump sg sglang VERSION" in (err.value.fix or "")
    assert snapshot(rel.ws.root) == before
    assert not (rel.ws.state_dir / "bump").exists()
    assert not rel.ws.wheel_cache.exists() or not any(rel.ws.wheel_cache.iterdir())


@pytest.mark.parametrize("project", ["flashinfer", "sglang"])
def test_a_version_that_does_not_exist_is_named_as_such(rel: Releases, project: str) -> None:
    """Issue 41: ``bump sg flashinfer 9.9.9`` answered with a pin-conflict hint advising
    a bump to "a release that pins flashinfer-python 9.9.9", never saying that 9.9.9
    does not exist; sglang 9.9.9 (its pins accept it) was "no sdist (unknown version?)"."""
    before = snapshot(rel.ws.root)
    with pytest.raises(MaintenanceError) as err:
        bump(stack_of(rel.ws, STACK), project, "9.9.9")
    newest = {"flashinfer": "flashinfer-python 9.9.9 ... newest: 0.7.3",
              "sglang": "sglang 9.9.9 ... newest: 0.5.25"}[project]
    name, _, last = newest.partition(" ... ")
    assert err.value.what == f"{name} does not exist on the package index; {last}"
    assert err.value.fix is None
    assert snapshot(rel.ws.root) == before


@pytest.mark.slow
def test_a_release_whose_gate_moved_is_named_with_the_layout_that_fits(
        rel: Releases) -> None:
    """sglang 0.5.25 keeps the gate in layers/communicator.py: the bump says the gate
    moved and which layout fits, before a file is written (the copied layout does not
    stay)."""
    before = snapshot(rel.ws.root)
    with pytest.raises(MaintenanceError) as err:
        bump(stack_of(rel.ws, STACK), "sglang", "0.5.25", new_stack="sg-moved")
    message = err.value.message
    assert "the gate moved: sglang 0.5.25 has no " + GATE_FILE in message
    assert "it fits the `communicator` layout" in message
    assert f"{GATE_FILE}" in message.rpartition("does not have: ")[2]
    assert snapshot(rel.ws.root) == before
    assert not (rel.ws.forks_dir / "sg-moved.toml").exists()
    assert not (rel.ws.state_dir / "bump").exists()


def _patch_flashinfer(rel: Releases, tmp_path: Path) -> None:
    """Give the stack's FlashInfer a series of one patch (so it no longer ships as
    published): a bump of sglang then bumps it, with its series, as a bump of its own."""
    repo = tmp_path / "flashinfer-repo"
    (repo / "flashinfer").mkdir(parents=True)
    (repo / "flashinfer" / "__init__.py").write_text("")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release 0.7.2")
    series = rel.ws.root / "patches" / STACK / "flashinfer"
    patch = make_patch(repo, series, "F1 comm: allow 12", {
        "flashinfer/__init__.py": ("", "SM12X = True\n")}, "flashinfer/__init__.py: SM12X")
    write_series(series, [patch.name])


@pytest.mark.slow
def test_a_coordinated_project_with_patches_is_bumped_with_its_series_first(
        rel: Releases, tmp_path: Path) -> None:
    _patch_flashinfer(rel, tmp_path)
    before = snapshot(rel.ws.root)
    result = bump(stack_of(rel.ws, STACK), "sglang", "0.5.24", new_stack="sg-next")
    assert [c.verdict for c in result.classifications] == ["still needed"]
    assert {k: v for k, v in snapshot(rel.ws.root).items() if k in before} == before
    stack = rel.ws.stack("sg-next")  # loads, its pins agreeing
    flashinfer = stack.project("flashinfer")
    assert flashinfer.version == "0.7.3"
    assert [w.filename for w in flashinfer.wheels] == [rel.flashinfer_073.name]
    assert len((rel.ws.root / "patches/sg-next/flashinfer/series").read_text().split()) == 1
    why = ("flashinfer-python 0.7.2 -> 0.7.3 with its series (a bump of its own): "
           "sglang 0.5.24 requires flashinfer_python[cu13]==0.7.3")
    assert result.moves == (why,)
    report = rel.ws.reports_dir / "bump" / "sg-next-flashinfer-0.7.2-to-0.7.3.md"
    assert f"- moved: {why}\n" in report.read_text()  # its own report says why it moved
    assert stack.description == (
        "flashinfer-python 0.7.3 + sglang 0.5.24, SM120/SM121 enabled")
    assert not any((rel.ws.state_dir / "bump").iterdir())


@pytest.mark.slow
def test_aborting_a_coordinated_bump_undoes_the_project_it_moved_too(
        rel: Releases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In place: interrupted once FlashInfer was bumped (its pin, series and report
    written), ``--abort`` of the sglang bump puts every file back."""
    _patch_flashinfer(rel, tmp_path)
    before = snapshot(rel.ws.root)
    report = rel.ws.reports_dir / "bump" / "sg-flashinfer-0.7.2-to-0.7.3.md"

    def interrupt(name: str) -> None:
        if name == "companion bumped":
            raise KeyboardInterrupt

    monkeypatch.setattr(bump_state, "stage_hook", interrupt)
    with pytest.raises(KeyboardInterrupt):
        bump(stack_of(rel.ws, STACK), "sglang", "0.5.24")
    monkeypatch.setattr(bump_state, "stage_hook", None)
    assert rel.ws.stack(STACK, strict=False).project("flashinfer").version == "0.7.3"
    assert report.is_file()
    bump_abort(rel.ws, STACK, "sglang")
    assert snapshot(rel.ws.root) == before
    assert not report.exists()
    assert rel.ws.stack(STACK).project("flashinfer").version == "0.7.2"


@pytest.mark.slow
@pytest.mark.parametrize("recover", ["continue", "abort"])
@pytest.mark.parametrize("step", ["state saved", "stack created", "old tree kept",
                                  "new tree made", "declaration written"])
def test_a_new_stack_bump_interrupted_at_each_step_recovers(
        rel: Releases, monkeypatch: pytest.MonkeyPatch, step: str, recover: str) -> None:
    """The new stack's copy is written after the journal: interrupted at any step,
    ``--abort`` leaves no trace of it and ``--continue`` finishes it."""
    before = snapshot(rel.ws.root)

    def interrupt(name: str) -> None:
        if name == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(bump_state, "stage_hook", interrupt)
    with pytest.raises(KeyboardInterrupt):
        bump(stack_of(rel.ws, STACK), "sglang", "0.5.24", new_stack="sg-next")
    monkeypatch.setattr(bump_state, "stage_hook", None)
    if recover == "abort":
        bump_abort(rel.ws, "sg-next", "sglang")
        assert snapshot(rel.ws.root) == before
        assert not (rel.ws.trees_dir / "sg-next").exists()
        assert not (rel.ws.reports_dir / "bump").exists() or not any(
            (rel.ws.reports_dir / "bump").iterdir())
        return
    result = bump_continue(rel.ws, "sg-next", "sglang")
    assert [c.verdict for c in result.classifications] == ["still needed"]
    assert rel.ws.stack("sg-next").project("flashinfer").version == "0.7.3"
    assert {k: v for k, v in snapshot(rel.ws.root).items() if k in before} == before



@pytest.mark.slow
def test_every_stop_of_a_coordinated_bump_names_the_bump_that_goes_on_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the trial's sglang 0.5.20 (issue 31), FlashInfer's bump stopped four times;
    only the first stop said that ``sglang --continue`` goes on once FlashInfer is done:
    the stops of ``flashinfer --skip`` did not."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-12-01")
    made = tmp_path / "made"
    made.mkdir()
    fi = {v: pack_release(made, "flashinfer-python", v, {"flashinfer/__init__.py": text}, [])
          for v, text in (("0.7.2", "A = 1\nB = 1\n"), ("0.7.3", "A = 3\nB = 3\n"))}
    sglang = {v: pack_release(made, "sglang", v, _sglang_files(v),
                              [f"flashinfer_python[cu13]=={f}"])
              for v, f in (("0.5.23", "0.7.2"), ("0.5.24", "0.7.3"))}
    root = sglang_toolkit(tmp_path, STACK, _toml(sglang["0.5.23"], fi["0.7.2"]),
                          _sglang_files("0.5.23"), GATE_FILE)
    ws = Workspace(root)
    repo = git_release(tmp_path / "flashinfer-repo", {"flashinfer/__init__.py": "A = 1\nB = 1\n"},
                       "release 0.7.2")
    series = root / "patches" / STACK / "flashinfer"
    patches = [make_patch(repo, series, f"F{i} comm: allow 12 ({name})", {
        "flashinfer/__init__.py": (f"{name} = 1", f"{name} = 12")},
        f"flashinfer/__init__.py: {name} = 12") for i, name in ((1, "A"), (2, "B"))]
    write_series(series, [p.name for p in patches])
    then = "once flashinfer is done, `python -m sm120fork bump sg-next sglang --continue`"
    with package_index(list(sglang.values()), "sglang",
                       more={"flashinfer-python": list(fi.values())}) as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        with pytest.raises(MaintenanceError) as first:
            bump(stack_of(ws, STACK), "sglang", "0.5.24", new_stack="sg-next")
        assert "0001-F1" in first.value.message
        assert then in (first.value.fix or "")
        with pytest.raises(MaintenanceError) as second:
            bump_continue(ws, "sg-next", "flashinfer", skip=True)
    assert "0002-F2" in second.value.message
    assert then in (second.value.fix or "")


@pytest.mark.slow
def test_a_companion_bump_that_re_pins_another_companion_is_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sglang 0.5.24 moves FlashInfer and sgl-kernel, each with a patch: FlashInfer's bump
    (the first) moves sgl-kernel with it, so sglang's bump finds sgl-kernel moved when it
    comes to it (read as declared then, not as the step started) and does not bump it
    again."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-12-01")
    made = tmp_path / "made"
    made.mkdir()
    kernel = {v: pack_release(made, "sgl-kernel", v, {"sgl_kernel/__init__.py": "K = 1\n"},
                              []) for v in ("1.0", "1.1")}
    fi = {v: pack_release(made, "flashinfer-python", v, {"flashinfer/__init__.py": "A = 1\n"},
                          [f"sgl-kernel=={k}"]) for v, k in (("0.7.2", "1.0"), ("0.7.3", "1.1"))}
    sglang = {v: pack_release(made, "sglang", v, _sglang_files(v),
                              [f"flashinfer_python=={f}", f"sgl-kernel=={k}"])
              for v, f, k in (("0.5.23", "0.7.2", "1.0"), ("0.5.24", "0.7.3", "1.1"))}
    toml = "\n".join([
        "[stack]", f'name = "{STACK}"', "default = true", "",
        *wheel_project(STACK, "kernel", "sgl-kernel", "1.0", kernel["1.0"]),
        *wheel_project(STACK, "flashinfer", "flashinfer-python", "0.7.2", fi["0.7.2"],
                       more=('upstream_requires = ["sgl-kernel==1.0"]',)),
        *wheel_project(STACK, "sglang", "sglang", "0.5.23", sglang["0.5.23"],
                       package_root="python", more=(
                           'upstream_requires = ["flashinfer_python==0.7.2", "sgl-kernel==1.0"]',
                           'layout = "layer_boundary"'))])
    root = sglang_toolkit(tmp_path, STACK, toml, _sglang_files("0.5.23"), GATE_FILE)
    kept = {}
    for key, package, text in (("kernel", "sgl_kernel", "K = 1\n"),
                               ("flashinfer", "flashinfer", "A = 1\n")):
        repo = git_release(tmp_path / f"{key}-repo", {f"{package}/__init__.py": text},
                           "release")
        series = root / "patches" / STACK / key
        name = text.split()[0]
        patch = make_patch(repo, series, f"{key.upper()[0]}1 allow 12", {
            f"{package}/__init__.py": (f"{name} = 1", f"{name} = 12")},
            f"{package}/__init__.py: {name} = 12")
        write_series(series, [patch.name])
        kept[key] = [patch.name]
    ws = Workspace(root)
    assert ws.stack(STACK).project("kernel").version == "1.0"  # its pins agree
    with package_index(list(sglang.values()), "sglang", more={
            "flashinfer-python": list(fi.values()),
            "sgl-kernel": list(kernel.values())}) as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        result = bump(stack_of(ws, STACK), "sglang", "0.5.24")
    stack = ws.stack(STACK)  # loads, its pins agreeing
    assert [(p.key, p.version) for p in stack.projects] == [
        ("kernel", "1.1"), ("flashinfer", "0.7.3"), ("sglang", "0.5.24")]
    assert list(result.companions) == ["flashinfer"]  # sgl-kernel: by FlashInfer's bump
    assert [c.verdict for c in result.companions["flashinfer"]] == ["still needed"]
    assert {k: (root / "patches" / STACK / k / "series").read_text().split()
            for k in kept} == kept
