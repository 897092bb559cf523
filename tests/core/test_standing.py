"""Which evidence stands (issue 29's "done when", on a real series in a temp checkout):
rewording a patch's Description stales nothing; changing one code line of one patch
stales exactly that patch's claims and the records that tested it, each with its command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_manifest import entry, write_manifest
from sm120fork.patch.series import load_series
from sm120fork.record import Case, Machine, Tested, TestedPatch, TestedWheel, make, write
from sm120fork.standing import Today, claim_standings, stack_evidence

from helpers_ws import DemoWorkspace, make_demo

WHEEL = "demo_lib-1.2.3+sm120.1-py3-none-any.whl"


@pytest.fixture
def demo(tmp_path: Path) -> DemoWorkspace:
    """The demo stack with a verify-sm120 and a gpu-test record of its series as it is,
    and Verified-By claims on lib's patches (one per kind of record)."""
    d = make_demo(tmp_path)
    first, second = load_series(d.series_dir("lib")).patches
    for patch, claim in ((first, "cpu:tests/test_x.py::test_x"),
                         (second, "gpu:reports/demo/gpu-test")):
        patch.path.write_text(patch.path.read_text().replace(
            "Last-Update:", f"Verified-By: {claim}\nLast-Update:", 1))
    tested = _tested(d)
    for kind, command in (("verify-sm120", "nox -s verify_sm120 -- --stack demo"),
                          ("gpu-test", "nox -s gpu_test -- --stack demo --quick")):
        write(make(kind=kind, stack="demo", command=command,
                   created="2026-12-03T17:00:00+00:00", toolkit="0",
                   machine=Machine(description="test"), tested=tested, planned=1,
                   cases=(Case(id="a", variant="patched", outcome="pass"),)),
              d.ws.reports_dir)
    return d


def _tested(d: DemoWorkspace, sha: str = "a" * 64) -> Tested:
    return Tested(wheels=(TestedWheel(variant="patched", project="lib", file=WHEEL,
                                      sha256=sha),),
                  patches=tuple(TestedPatch(project=key, patch=p.name, patch_id=p.patch_id)
                                for key in ("lib", "app")
                                for p in load_series(d.series_dir(key)).patches))


def _stale(d: DemoWorkspace) -> dict[str, str]:
    stack = d.ws.stack("demo")
    today = Today.of(d.ws, stack)
    return {s.name: s.message() for s in (*stack_evidence(d.ws, stack, today=today),
                                          *claim_standings(d.ws, stack, today))
            if not s.current}


def test_evidence_of_the_series_as_it_is_is_current(demo: DemoWorkspace) -> None:
    assert _stale(demo) == {}


def test_rewording_a_description_stales_nothing(demo: DemoWorkspace) -> None:
    for patch in load_series(demo.series_dir("lib")).patches:
        patch.path.write_text(patch.path.read_text()
                              .replace("Description: ", "Description: Reworded: ", 1)
                              .replace("Forwarded: no", "Forwarded: not-needed"))
    assert _stale(demo) == {}


def test_one_changed_code_line_stales_exactly_its_evidence(demo: DemoWorkspace) -> None:
    second = load_series(demo.series_dir("lib")).patches[1]
    text = second.path.read_text()
    line = "+#if __CUDA_ARCH__ >= 900  // SM12x: guard removed"
    assert line in text
    second.path.write_text(text.replace(line, line + " for good"))
    stale = _stale(demo)
    name = second.name.removesuffix(".patch")
    assert sorted(stale) == ["patches/demo/lib/" + name + ": gpu:reports/demo/gpu-test",
                             "reports/demo/gpu-test", "reports/demo/verify-sm120"]
    assert "lib patch(es) changed or added since: " + name in stale["reports/demo/gpu-test"]
    assert stale["reports/demo/gpu-test"].endswith(
        "re-make: nox -s gpu_test -- --stack demo --quick")
    assert stale["reports/demo/verify-sm120"].endswith(
        "re-make: nox -s verify_sm120 -- --stack demo")
    claim = stale["patches/demo/lib/" + name + ": gpu:reports/demo/gpu-test"]
    assert "made before this patch's change" in claim
    assert claim.endswith("re-make: nox -s gpu_test -- --stack demo --quick")


def test_a_wheel_built_here_that_differs_stales_the_records_that_ran_another(
        demo: DemoWorkspace) -> None:
    manifest = demo.ws.stack_wheels("demo") / "manifest.json"
    manifest.parent.mkdir(parents=True)
    write_manifest(manifest.parent, "demo", entry("lib", wheel=WHEEL, sha256="a" * 64))
    assert _stale(demo) == {}
    write_manifest(manifest.parent, "demo", entry("lib", wheel=WHEEL, sha256="b" * 64))
    stale = _stale(demo)
    assert sorted(stale) == ["reports/demo/gpu-test", "reports/demo/verify-sm120"]
    assert "the lib wheel it ran (sha256 aaaaaaaaaaaa) is not the one built now" in \
        stale["reports/demo/gpu-test"]


def test_a_claim_backed_by_another_stacks_record_does_not_count(
        demo: DemoWorkspace) -> None:
    lib = demo.series_dir("lib")
    second = load_series(lib).patches[1]
    other = demo.ws.reports_dir / "demo" / "gpu-test" / "record.json"
    doc = json.loads(other.read_text())
    target = demo.ws.reports_dir / "other" / "gpu-test" / "record.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({**doc, "stack": "other",
                                  "command": "nox -s gpu_test -- --stack other --quick"}))
    second.path.write_text(second.path.read_text().replace(
        "gpu:reports/demo/gpu-test", "gpu:reports/other/gpu-test"))
    claim = next(v for k, v in _stale(demo).items() if k.startswith("patches/"))
    assert "ran on stack other: it does not count for stack demo" in claim
    assert claim.endswith("re-make: nox -s gpu_test -- --stack demo --quick")


def test_status_lists_each_projects_records_and_claims(demo: DemoWorkspace) -> None:
    from sm120fork.maintain.status import stack_standings

    records, claims = stack_standings(demo.ws, demo.ws.stack("demo"))
    assert [r.name for r in records["lib"]] == ["reports/demo/gpu-test",
                                                "reports/demo/verify-sm120"]
    assert all(r.current for r in records["lib"])
    assert len(claims["lib"]) == 2
    assert claims["app"] == ()
