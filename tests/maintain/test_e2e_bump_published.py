"""The real bump that empties a series: the default stack's FlashInfer to 0.6.18.post1,
which has F1-F6 upstream (network: ~40 MB from the package index, ~1-2 min)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sm120fork.cli.main import main
from sm120fork.maintain.state import DROPPED_BY_HAND, UPSTREAMED_DIFFERENTLY
from sm120fork.package.stack import build_stack
from sm120fork.workspace import Workspace

from helpers_ws import checkout_copy

pytestmark = [pytest.mark.network, pytest.mark.slow]
NEW = "flashinfer-0.6.18"


def test_bump_to_0_6_18_post1_ends_as_published_and_builds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SM120FORK_TODAY", "2026-12-01")
    ws = Workspace(checkout_copy(tmp_path))
    root = ["--root", str(ws.root)]
    code = main([*root, "bump", "sglang-0.5.10", "flashinfer", "0.6.18.post1",
                 "--new-stack", NEW])
    # F1-F6 are upstream; the packaging patches that serve only our own build conflict.
    while code == 14:
        err = capsys.readouterr().err
        assert re.search(r"patch \S+packaging\S+ conflicts with flashinfer 0\.6\.18\.post1",
                         err), err
        code = main([*root, "bump", NEW, "flashinfer", "--skip"])
    assert code == 0
    out = capsys.readouterr().out
    assert ("the series is empty: the stack ships flashinfer-python 0.6.18.post1 as "
            "published (flashinfer_python-0.6.18.post1-py3-none-any.whl)") in out
    report = (ws.reports_dir / "bump" /
              f"{NEW}-flashinfer-0.6.7.post3-to-0.6.18.post1.md").read_text()
    verdicts = re.findall(r"^\| (\S+) \| .* \| \*\*(.+?)\*\* \|", report.split(
        "## Classification (as applied)")[1], re.MULTILINE)
    assert {v for n, v in verdicts if "-F" in n} == {UPSTREAMED_DIFFERENTLY}
    assert {v for n, v in verdicts if "packaging" in n} == {DROPPED_BY_HAND}
    changelog = (ws.root / "patches" / NEW / "CHANGELOG.md").read_text()
    assert changelog.count("- dropped ") == len(verdicts)
    project = ws.stack(NEW).project("flashinfer")
    assert [w.filename for w in project.wheels] == [
        "flashinfer_python-0.6.18.post1-py3-none-any.whl"]
    (build,) = build_stack(ws, ws.stack(NEW))
    assert (build.version, build.sha256) == ("0.6.18.post1", project.wheels[0].sha256)
    assert build.entry.used_as_published
    assert ws.stack("sglang-0.5.10").project("flashinfer").version == "0.6.7.post3"
