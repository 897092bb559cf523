"""``bump --new-stack`` of an SGLang project: the new stack is a toml and patches on a known
layout, which the toolkit loads and checks through that layout (issue 17 item 1).

The stack is shaped like ``sglang-0.5.23``: sglang as a ``wheel`` source (no sdist) with
its series, ``requires = ["flashinfer"]`` and ``layout = "layer_boundary"``; FlashInfer as
published.  The wheels are made here and served by a local package index (no network).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import sm120fork.verify.proof.stack as verify_stack
from sm120fork.errors import MaintenanceError
from sm120fork.layouts.results import CheckResult
from sm120fork.maintain.bump import bump, bump_abort
from sm120fork.resolved import ResolvedStack
from sm120fork.workspace import Workspace

from helpers_maintain import pack_release, package_index, sglang_toml, sglang_toolkit, snapshot

STACK = "sg"
GATE = "def fused_allowed(major):\n    return major in (9, 10)\n"


def _sglang_files(version: str) -> dict[str, str]:
    return {"sglang/__init__.py": f'__version__ = "{version}"\n',
            "sglang/srt/layers/layer_boundary/gate.py": GATE}


def _toml(sglang: Path, flashinfer: Path) -> str:
    return sglang_toml(
        STACK, sglang, flashinfer, requires_dist="flashinfer-python==0.7.2",
        flashinfer_url=True, comments={
            "[stack]": "A stack shaped like sglang-0.5.23.",
            "layout": "Where this release keeps the code the series changes."})


@dataclass
class SglangStack:
    ws: Workspace
    new_wheel: Path


@pytest.fixture
def sg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
       request: pytest.FixtureRequest) -> Iterator[SglangStack]:
    """``request.param``: the gate file of the new release (default: unchanged)."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-12-01")
    made = tmp_path / "made"
    made.mkdir()
    flashinfer = pack_release(made, "flashinfer-python", "0.7.2",
                              {"flashinfer/__init__.py": ""}, [])
    old = pack_release(made, "sglang", "0.5.23", _sglang_files("0.5.23"),
                       ["flashinfer-python==0.7.2"])
    new_files = {**_sglang_files("0.5.24"), "sglang/srt/server_args.py": "TP = 1\n",
                 "sglang/srt/layers/layer_boundary/gate.py": getattr(request, "param", GATE)}
    new = pack_release(made, "sglang", "0.5.24", new_files, ["flashinfer-python==0.7.2"])
    root = sglang_toolkit(tmp_path, STACK, _toml(old, flashinfer), _sglang_files("0.5.23"),
                          "sglang/srt/layers/layer_boundary/gate.py",
                          extra_fields="Verified-By: sglang:G1\n")
    with package_index([old, new], "sglang") as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        yield SglangStack(ws=Workspace(root), new_wheel=new)


@pytest.mark.slow
def test_bump_new_stack_of_sglang_writes_a_stack_on_its_layout(
        sg: SglangStack, monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(sg.ws.root)
    result = bump(ResolvedStack.named(sg.ws, STACK, strict=False), "sglang", "0.5.24",
                  new_stack="sg-next")
    assert result.new_stack_created
    assert [c.verdict for c in result.classifications] == ["still needed"]
    # The source stack is as it was.
    after = snapshot(sg.ws.root)
    assert {k: v for k, v in after.items() if k in before} == before
    # The toml: the layout key, the series of each project, the new pin.
    declared = tomllib.loads((sg.ws.forks_dir / "sg-next.toml").read_text())
    sglang, flashinfer = declared["projects"]["sglang"], declared["projects"]["flashinfer"]
    assert declared["stack"]["default"] is False
    assert sglang["layout"] == "layer_boundary"
    assert sglang["requires"] == ["flashinfer"]
    assert sglang["series"] == "patches/sg-next/sglang"
    assert flashinfer["series"] == "patches/sg-next/flashinfer"
    assert sglang["version"] == "0.5.24"
    assert [w["filename"] for w in sglang["wheels"]] == [sg.new_wheel.name]
    assert "git" not in sglang
    assert "sdist" not in sglang
    assert flashinfer["version"] == "0.7.2"
    # Its series: the patches, and FlashInfer's (empty) series beside them.
    names = (sg.ws.root / "patches/sg-next/sglang/series").read_text().split()
    assert len(names) == 1
    assert "Verified-By: sglang:G1" in (sg.ws.root / "patches/sg-next/sglang" /
                                         names[0]).read_text()
    assert (sg.ws.root / "patches/sg-next/flashinfer/series").read_text().split() == []
    # Its claims name checks, not stacks: each is carried to sg-next's own records (none
    # made yet), and the console and the report say which command makes them (issue 41).
    assert result.remake == (f"`nox -s verify_sm120 -- --stack sg-next`: "
                             f"{names[0].removesuffix('.patch')}: sglang:G1 (missing)",)
    assert (f"Stack sg-next is new: its patches' claims name checks, not stacks, so each is "
            f"carried to sg-next's own records, which these commands make:\n- "
            f"{result.remake[0]}") in result.report.read_text()
    # The toolkit loads it ...
    stack = sg.ws.stack("sg-next")
    assert [p.key for p in stack.projects] == ["flashinfer", "sglang"]
    assert stack.project("sglang").layout == "layer_boundary"
    # ... and dispatches its behaviour checks by that layout (the adapter is recorded and
    # stood in for: the real checks need SGLang's own modules).
    asked: list[str] = []

    def check(tree: Path, **_: Any) -> list[CheckResult]:
        assert (tree / "python/sglang/srt/layers/layer_boundary/gate.py").read_text() == (
            GATE.replace("(9, 10)", "(9, 10, 12)  # sm12x"))
        return [CheckResult(name="G1 fused path on 12", capability="12.0", expected="true",
                            observed="true", passed=True, detail="")]

    def adapter(name: str) -> SimpleNamespace:
        asked.append(name)
        return SimpleNamespace(check=check)

    monkeypatch.setattr(verify_stack, "adapter", adapter)
    verified = verify_stack.run_verify(sg.ws, stack)
    assert asked == ["layer_boundary"]
    (g1,) = verified.verdicts
    assert g1.passed, g1.checks
    assert g1.evidence == "CPU behaviour check"
    assert verified.provenance[1].wheel == "sglang-0.5.24+sm120.1-py3-none-any.whl"


@pytest.mark.slow
@pytest.mark.parametrize("sg", [GATE.replace("(9, 10)", "(9, 10, 11)")], indirect=True)
def test_aborting_a_bump_into_a_new_stack_removes_every_series_it_copied(
        sg: SglangStack, caplog: pytest.LogCaptureFixture) -> None:
    """The copy holds FlashInfer's series too; --abort leaves no patches/<stack>/ behind.
    Removing the new stack's fork trees took 150 s on the trial's machine (issue 31):
    the abort says what it removes instead of appearing to hang."""
    with pytest.raises(MaintenanceError, match=r"conflicts with sglang 0\.5\.24"):
        bump(ResolvedStack.named(sg.ws, STACK, strict=False), "sglang", "0.5.24",
             new_stack="sg-other")
    assert (sg.ws.root / "patches" / "sg-other" / "flashinfer" / "series").is_file()
    with caplog.at_level("INFO", logger="sm120fork"):
        bump_abort(sg.ws, "sg-other", "sglang")
    assert "removing the fork trees of stack sg-other (.forks/trees/sg-other)" in caplog.text
    assert not (sg.ws.trees_dir / "sg-other").exists()
    assert not (sg.ws.forks_dir / "sg-other.toml").exists()
    assert not (sg.ws.root / "patches" / "sg-other").exists()
