"""The status table: readable at 80 columns, every field with --wide, and Forwarded /
Applied-Upstream shown as one statement that cannot contradict itself."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from sm120fork.cli.maintain import render_status, upstream_cell
from sm120fork.maintain.status import PatchStatus, ProjectStatus

PR = "https://github.com/flashinfer-ai/flashinfer/pull/3903"


def _project() -> ProjectStatus:
    wheel = "flashinfer_python-0.6.7.post3+sm120.1-py3-none-any.whl"
    rows = (
        PatchStatus(patch="0002-F1-jit-build-the-trtllm-comm-module-for-SM12x.patch",
                    subject="F1", applies="yes", forwarded="no",
                    applied_upstream=f"0.6.17, {PR}", bug_upstream="",
                    fingerprint_upstream="absent", effect_upstream="absent", wheel=wheel),
        PatchStatus(patch="0007-F6-workspace-multicast-only-when-requested.patch",
                    subject="F6", applies="yes",
                    forwarded="https://github.com/flashinfer-ai/flashinfer/pull/3701",
                    applied_upstream="", bug_upstream="",
                    fingerprint_upstream="partly (1/2)", effect_upstream="present",
                    wheel=wheel),
    )
    return ProjectStatus(stack="sglang-0.5.10", default=True, project="flashinfer",
                         version="0.6.7.post3", source="sdist", series="patches/x",
                         patches=rows)


def _render(wide: bool) -> str:
    console = Console(width=80, record=True, color_system=None)
    render_status([_project()], console, wide=wide)
    return console.export_text()


def test_the_default_table_fits_80_columns_and_says_one_thing_about_upstream() -> None:
    text = _render(wide=False)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "in 0.6.17" in text  # cells wrap; upstream_cell's whole text is tested below
    assert "#3903" in text
    assert "Forwarded" not in text  # no "Forwarded: no" beside "Applied-Upstream: 0.6.17"
    assert "applies" in text
    assert "0.6.7.post3" in text


def test_wide_shows_every_field() -> None:
    text = Console(width=200, record=True, color_system=None)
    render_status([_project()], text, wide=True)
    out = text.export_text()
    for header in ("Forwarded", "Applied-Upstream", "Bug-Upstream", "fingerprint in pin",
                   "effect in pin"):
        assert header in out


def test_upstream_cell() -> None:
    assert upstream_cell("no", "") == "not forwarded"
    assert upstream_cell("not-needed", "") == "not needed"
    assert upstream_cell("no", f"0.6.17, {PR}") == "in 0.6.17 (flashinfer#3903)"
    assert upstream_cell("yes", "0.6.16") == "in 0.6.16"


def test_wide_at_80_columns_or_in_a_pipe_is_a_record_per_patch() -> None:
    console = Console(width=80, record=True, color_system=None)
    render_status([_project()], console, wide=True)
    out = console.export_text()
    assert "  0002-F1-jit-build-the-trtllm-comm-module-for-SM12x\n" in out
    assert "    Applied-Upstream: 0.6.17, flashinfer#3903\n" in out
    assert "    fingerprint in pin: partly (1/2)\n" in out
    assert "    Forwarded: https://github.com/flashinfer-ai/flashinfer/pull/3701\n" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_a_doubled_patch_number_is_shown_once() -> None:
    from sm120fork.patch.series import display_name

    assert display_name("0001-0001-packaging-match-companion.patch") == \
        "0001-packaging-match-companion"
    assert display_name("0008-0002-packaging-load.patch") == "0008-0002-packaging-load"
    assert display_name("0002-F1-jit.patch") == "0002-F1-jit"
    project = _project()
    doubled = (dataclasses.replace(project.patches[0],
                                   patch="0001-0001-packaging-match-companion.patch"),)
    console = Console(width=80, record=True, color_system=None)
    render_status([dataclasses.replace(project, patches=doubled)], console,
                  wide=False)
    assert "0001-0001" not in console.export_text()


def test_each_stacks_evidence_shows_current_or_stale_with_its_command() -> None:
    """status says, per kind of record, whether the evidence stands, and for a stale or
    missing one why, the one command that re-makes it and what it needs; claims not
    current are listed with their state (issues 29 and 41)."""
    import dataclasses
    import json

    from sm120fork.standing import Standing

    current = Standing(name="reports/sglang-0.5.10/gpu-test", kind="gpu-test", state="current",
                       command="nox -s gpu_test -- --stack sglang-0.5.10 --quick",
                       verdict="pass")
    stale = Standing(name="reports/sglang-0.5.10/verify-sm120", kind="verify-sm120",
                     state="stale", reasons=("flashinfer patch(es) changed or added since: "
                                             "0005-F4",),
                     command="nox -s verify_sm120 -- --stack sglang-0.5.10", verdict="pass",
                     needs="nvcc >= 12.9")
    missing = Standing(name="reports/sglang-0.5.10/bench", kind="bench", state="missing",
                       reasons=("never made",), needs="a GPU",
                       command="nox -s bench -- --stack sglang-0.5.10")
    claim = Standing(name="patches/x/0005-F4: gpu:gpu-test", kind="gpu-test", state="stale",
                     reasons=("made before this change",), needs="a GPU",
                     command="nox -s gpu_test -- --stack sglang-0.5.10 --quick")
    failed = dataclasses.replace(claim, name="patches/x/0006-F5: gpu:bench", state="fail")
    project = dataclasses.replace(_project(), evidence=(current, stale, missing),
                                  claims=(claim, failed))
    console = Console(width=250, record=True, color_system=None)
    render_status([project], console, wide=False)
    text = console.export_text()
    assert "sglang-0.5.10: evidence" in text
    assert "│ gpu-test     │ reports/sglang-0.5.10/gpu-test     │ current │ pass" in text
    assert ("stale   │ flashinfer patch(es) changed or added since: 0005-F4; re-make: nox -s "
            "verify_sm120 -- --stack sglang-0.5.10 (needs nvcc >= 12.9)") in text
    assert ("missing │ never made; re-make: nox -s bench -- --stack sglang-0.5.10 (needs a "
            "GPU)") in text
    assert "claims (Verified-By): 0 of 2 current" in text
    assert "stale: patches/x/0005-F4: gpu:gpu-test: stale" in text
    assert "fail: patches/x/0006-F5: gpu:bench: fail" in text
    data = json.loads(json.dumps(dataclasses.asdict(project)))
    assert [e["state"] for e in data["evidence"]] == ["current", "stale", "missing"]
    assert data["evidence"][2]["needs"] == "a GPU"
    assert data["claims"][0]["command"] == "nox -s gpu_test -- --stack sglang-0.5.10 --quick"
