"""status/bump: a release's files the stack does not declare (issue 18 item 5)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from sm120fork.declare import load_stack
from sm120fork.errors import MaintenanceError
from sm120fork.fetch.index import IndexFile, ProjectPage
from sm120fork.layouts import marker
from sm120fork.maintain.bump import bump
from sm120fork.maintain.pin import create_stack_check
from sm120fork.maintain.preflight import Release, check_layout
from sm120fork.maintain.release import release_wheels, undeclared_wheels
from sm120fork.workspace import Workspace

from helpers_maintain import stack_of

REPO = Path(__file__).resolve().parents[2]
TAGS = [f"cp3{minor}-cp3{minor}-manylinux_2_34_{arch}"
        for minor in (11, 12, 13) for arch in ("x86_64", "aarch64")]


def _page(*names: str, yanked: tuple[str, ...] = ()) -> ProjectPage:
    return ProjectPage(url="https://index.invalid/simple/sglang/", files=tuple(
        IndexFile(filename=n, url=f"https://index.invalid/{n}", sha256="0" * 64,
                  yanked=n in yanked) for n in names))


def test_the_sglang_0_5_23_stack_declares_every_wheel_of_its_release() -> None:
    """The index lists six wheels of sglang 0.5.23 (cp311-cp313, x86_64 and aarch64)."""
    project = load_stack(REPO / "forks" / "sglang-0.5.23.toml").project("sglang")
    page = _page(*(f"sglang-0.5.23-{t}.whl" for t in TAGS), "sglang-0.5.22-cp313-cp313-"
                 "manylinux_2_34_x86_64.whl", "sglang-0.5.23.tar.gz")
    assert len(release_wheels(project, page)) == 6
    assert undeclared_wheels(project, page) == ()


def test_a_release_file_the_stack_does_not_declare_is_named() -> None:
    project = load_stack(REPO / "forks" / "sglang-0.5.23.toml").project("sglang")
    extra = "sglang-0.5.23-cp314-cp314-manylinux_2_34_x86_64.whl"
    page = _page(*(f"sglang-0.5.23-{t}.whl" for t in TAGS), extra,
                 "sglang-0.5.23-cp314-cp314-manylinux_2_34_aarch64.whl",
                 yanked=("sglang-0.5.23-cp314-cp314-manylinux_2_34_aarch64.whl",))
    assert undeclared_wheels(project, page) == (extra,)
    # A new pin (bump): every wheel of that release is undeclared until declared.
    assert len(undeclared_wheels(project, _page("sglang-0.5.24-py3-none-any.whl"),
                                 "0.5.24")) == 1


def test_an_sdist_source_builds_its_wheel_so_nothing_is_undeclared() -> None:
    project = load_stack(REPO / "forks" / "sglang-0.5.10.toml").project("flashinfer")
    page = _page("flashinfer_python-0.6.7.post3-py3-none-any.whl")
    assert undeclared_wheels(project, page) == ()


def test_status_says_which_release_files_are_not_declared(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from sm120fork.cli.maintain import render_status
    from sm120fork.maintain import release, status

    stack = load_stack(REPO / "forks" / "sglang-0.5.23.toml")
    extra = "sglang-0.5.23-cp314-cp314-manylinux_2_34_x86_64.whl"
    monkeypatch.setattr(release, "project_page", lambda project: _page(
        *(f"sglang-0.5.23-{t}.whl" for t in TAGS), extra))
    # status and bump call this one function (maintain/release.py).
    assert "release_check(project)" in Path(status.__file__).read_text()
    assert release.release_check(stack.project("sglang")) == (
        (extra,), f"1 NOT DECLARED: {extra}")
    assert release.release_check(stack.project("flashinfer")) == ((), "all declared")
    row = status.ProjectStatus(stack=stack.name, default=False, project="sglang",
                               version="0.5.23", source="wheel", series="s", patches=(),
                               undeclared_files=(extra,), release_files=f"1 NOT DECLARED: {extra}")
    console = Console(record=True, width=200)
    render_status([row], console, wide=False)
    assert f"release files: 1 NOT DECLARED: {extra}" in console.export_text()
    assert json.loads(json.dumps(dataclasses.asdict(row)))["undeclared_files"] == [extra]


@pytest.mark.parametrize(("version", "hint"), [
    ("0.5.23", "stack sglang-0.5.23 already pins sglang 0.5.23 on that layout: "
               "`python -m sm120fork build --stack sglang-0.5.23`"),
    ("0.5.24", "start from a stack on that layout: `python -m sm120fork bump sglang-0.5.23 "
               "sglang 0.5.24 --new-stack sglang-0.5.24`")])
def test_a_moved_gate_names_a_step_that_works_when_pasted(version: str, hint: str) -> None:
    """Issue 41 trial: bumping sglang-0.5.10 to 0.5.23 (the gate moved to the
    layer_boundary layout) advised `bump sglang-0.5.23 sglang 0.5.23 --new-stack NAME`,
    which refuses (sglang-0.5.23 already pins 0.5.23) and names no stack.  Now: the stack
    that pins the release, or a new stack copied from one on that layout under a free
    name that --new-stack accepts."""
    ws = Workspace(REPO)
    stack = ws.stack("sglang-0.5.10")
    project = stack.project("sglang")
    release = Release(files=frozenset({marker("layer_boundary")}), requires=())
    with pytest.raises(MaintenanceError) as err:
        check_layout(list(ws.stacks().values()), stack, project, version, release,
                     {"G1": [marker("communicator")]})
    assert (err.value.fix or "").endswith(hint)
    if version == "0.5.24":
        create_stack_check(ws, "sglang-0.5.24")  # the name is free: no refusal


def test_a_downgrade_is_refused_with_the_command_that_means_it(tmp_path: Path) -> None:
    """Issue 41 trial: `bump sglang-0.5.23 sglang 0.5.22 --new-stack sglang-0.5.22` said
    "pass --allow-downgrade if you mean it", no command to paste; refused before a write."""
    for folder in ("forks", "patches"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    with pytest.raises(MaintenanceError) as err:
        bump(stack_of(Workspace(tmp_path), "sglang-0.5.23"), "sglang", "0.5.22",
             new_stack="sglang-0.5.22")
    assert err.value.fix == ("if you mean it: `python -m sm120fork bump sglang-0.5.23 sglang "
                             "0.5.22 --new-stack sglang-0.5.22 --allow-downgrade`")
    assert not (tmp_path / "forks" / "sglang-0.5.22.toml").exists()
