"""Which evidence stands (issue 29's "done when", on a real series in a temp checkout):
rewording a patch's Description stales nothing; changing one code line of one patch
stales exactly that patch's claims and the records that tested it, each with its command.
A claim counts only when a passing record of its own stack backs it: a record never made
is missing, a failed one fails, and a copy of the stack claims its own (issue 41)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from helpers_manifest import entry, write_manifest
from sm120fork.declare import Stack
from sm120fork.errors import SeriesError
from sm120fork.patch.series import load_series
from sm120fork.record import Case, Machine, Tested, TestedPatch, TestedWheel, make, write
from sm120fork.resolved import ResolvedStack
from sm120fork.standing import claim_standings, stack_evidence, to_remake
from sm120fork.verify.proof.patches import Context, check_gpu_report

from helpers_ws import DemoWorkspace, make_demo

WHEEL = "demo_lib-1.2.3+sm120.1-py3-none-any.whl"


@pytest.fixture
def demo(tmp_path: Path) -> DemoWorkspace:
    """The demo stack with a verify-sm120 and a gpu-test record of its series as it is,
    and Verified-By claims on lib's patches (one per kind of record)."""
    d = make_demo(tmp_path)
    first, second = load_series(d.series_dir("lib")).patches
    for patch, claim in ((first, "cpu:tests/test_x.py::test_x"), (second, "gpu:gpu-test")):
        patch.path.write_text(patch.path.read_text().replace(
            "Last-Update:", f"Verified-By: {claim}\nLast-Update:", 1))
    _records(d)
    return d


def _records(d: DemoWorkspace, stack: str = "demo", failing: str = "") -> None:
    """A verify-sm120 record (a case per patch; ``failing``: that patch's case fails) and a
    gpu-test record of ``stack``, made from its series as it is."""
    tested = _tested(d, stack=stack)
    per_patch = tuple(Case(id=f"{p.project}/{p.patch}", variant="full series",
                           outcome="fail" if p.patch == failing else "pass")
                      for p in tested.patches)
    for kind, cases in (("verify-sm120", per_patch),
                        ("gpu-test", (Case(id="a", variant="patched", outcome="pass"),))):
        write(make(kind=kind, stack=stack, command=f"nox -s {kind} -- --stack {stack}",
                   created="2026-12-03T17:00:00+00:00", toolkit="0",
                   machine=Machine(description="test"), tested=tested, planned=len(cases),
                   cases=cases), d.ws.reports_dir)


def _tested(d: DemoWorkspace, sha: str = "a" * 64, stack: str = "demo") -> Tested:
    return Tested(wheels=(TestedWheel(variant="patched", project="lib", file=WHEEL,
                                      sha256=sha),),
                  patches=tuple(TestedPatch(project=key, patch=p.name, patch_id=p.patch_id)
                                for key in ("lib", "app") for p in load_series(
                                    d.ws.root / "patches" / stack / key).patches))


def _stale(d: DemoWorkspace, name: str = "demo") -> dict[str, str]:
    stack = d.ws.stack(name)
    today = ResolvedStack.of(d.ws, stack)
    return {s.name: s.message() for s in (*stack_evidence(today),
                                          *claim_standings(today))
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
    assert sorted(stale) == ["patches/demo/lib/" + name + ": gpu:gpu-test",
                             "reports/demo/gpu-test", "reports/demo/verify-sm120"]
    assert "lib patch(es) changed or added since: " + name in stale["reports/demo/gpu-test"]
    assert stale["reports/demo/gpu-test"].endswith(
        "re-make: nox -s gpu_test -- --stack demo --quick (needs a GPU)")
    assert stale["reports/demo/verify-sm120"].endswith(
        "re-make: nox -s verify_sm120 -- --stack demo")
    claim = stale["patches/demo/lib/" + name + ": gpu:gpu-test"]
    assert ": stale (reports/demo/gpu-test was made before this patch's change" in claim
    assert claim.endswith("re-make: nox -s gpu_test -- --stack demo --quick (needs a GPU)")


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


def test_a_claim_whose_record_ran_another_build_is_to_remake(demo: DemoWorkspace) -> None:
    """A claim's patch is in a record that passed, but the record ran another wheel (the
    old pin, before a bump): bump's "Evidence to re-make" lists it as watch does, with the
    record's state and command (it called the claim current)."""
    manifest = demo.ws.stack_wheels("demo") / "manifest.json"
    manifest.parent.mkdir(parents=True)
    write_manifest(manifest.parent, "demo", entry("lib", wheel=WHEEL, sha256="a" * 64))
    assert to_remake(ResolvedStack.named(demo.ws, "demo")) == []
    write_manifest(manifest.parent, "demo", entry("lib", wheel=WHEEL, sha256="b" * 64))
    first, second = (p.name.removesuffix(".patch")
                     for p in load_series(demo.series_dir("lib")).patches)
    assert to_remake(ResolvedStack.named(demo.ws, "demo")) == [
        f"`nox -s verify_sm120 -- --stack demo`: {first}: cpu:tests/test_x.py::test_x "
        "(stale)",
        f"`nox -s gpu_test -- --stack demo --quick` (needs a GPU): {second}: gpu:gpu-test "
        "(stale)"]


def test_a_renumbered_patch_keeps_its_claim(demo: DemoWorkspace) -> None:
    """Issue 41 trial: the watch's bump dropped G2 and G3, so G4 became 0002-G4; its
    verify-sm120 claim was "fail: this patch's case: not in it", though the record tested
    that very change (its patch-id) under the old name."""
    series = demo.series_dir("lib")
    first = load_series(series).patches[0]
    renamed = first.path.with_name("0009-" + first.path.name.partition("-")[2])
    first.path.rename(renamed)
    (series / "series").write_text((series / "series").read_text().replace(
        first.path.name, renamed.name))
    claim = next(s for s in claim_standings(ResolvedStack.named(demo.ws, "demo"))
                 if s.kind == "verify-sm120")
    assert claim.name.partition(": ")[0].rsplit("/", 1)[1].startswith("0009-")
    assert claim.state == "current", claim.message()


def test_a_record_never_made_is_missing_and_backs_no_claim(demo: DemoWorkspace) -> None:
    """Named as missing (not stale), with the command that makes it and what it needs."""
    for kind in ("gpu-test", "verify-sm120"):
        (demo.ws.reports_dir / "demo" / kind / "record.json").unlink()
    stack = demo.ws.stack("demo")
    today = ResolvedStack.of(demo.ws, stack)
    got = {s.name: s for s in (*stack_evidence(today),
                               *claim_standings(today))}
    assert {n: s.state for n, s in got.items()} == dict.fromkeys(got, "missing")
    gpu = got["reports/demo/gpu-test"]
    assert gpu.message() == ("reports/demo/gpu-test: missing (never made); re-make: nox -s "
                             "gpu_test -- --stack demo --quick (needs a GPU)")
    assert got["reports/demo/verify-sm120"].needs == ""  # no compile proof claimed
    claim = next(s for n, s in got.items() if n.endswith(": gpu:gpu-test"))
    assert claim.reasons == ("reports/demo/gpu-test/record.json was never made",)
    assert claim.command == "nox -s gpu_test -- --stack demo --quick"


def test_a_failed_record_backs_no_claim(demo: DemoWorkspace) -> None:
    """A verify-sm120 record that failed: the record and the claims it would back are
    "fail", the claim of a patch whose own case failed included."""
    first = load_series(demo.series_dir("lib")).patches[0]
    _records(demo, failing=first.name)
    stack = demo.ws.stack("demo")
    today = ResolvedStack.of(demo.ws, stack)
    records = {s.kind: s.state for s in stack_evidence(today)}
    assert records == {"verify-sm120": "fail", "gpu-test": "current"}
    (claim,) = [s for s in claim_standings(today) if s.kind == "verify-sm120"]
    assert claim.state == "fail"
    assert "reports/demo/verify-sm120: fail" in claim.message()


def _copy(demo: DemoWorkspace) -> Stack:
    """The demo stack copied as ``copy`` (its toml and patch folders, nothing else; one
    stack is the default: the copy of the default one is not)."""
    root = demo.ws.root
    toml = (root / "forks" / "demo.toml").read_text()
    (root / "forks" / "copy.toml").write_text(
        toml.replace('name = "demo"', 'name = "copy"').replace("patches/demo/", "patches/copy/")
        .replace("default = true", "default = false"))
    shutil.copytree(root / "patches" / "demo", root / "patches" / "copy")
    return demo.ws.stack("copy")


def test_a_renamed_copy_of_a_stack_claims_its_own_records(demo: DemoWorkspace) -> None:
    """A copy of the stack under another name (its toml and patch folders, nothing else)
    resolves every claim to its own records: the original's back none of them.  (One
    stack is the default: the copy of the default one is not.)"""
    stack = _copy(demo)
    claims = claim_standings(ResolvedStack.of(demo.ws, stack))
    assert [(s.kind, s.state) for s in claims] == [("verify-sm120", "missing"),
                                                   ("gpu-test", "missing")]
    assert all("reports/copy/" in s.reasons[0] and "--stack copy" in s.command
               for s in claims)
    _records(demo, stack="copy")
    assert _stale(demo, "copy") == {}


def test_a_copy_built_byte_identical_is_backed_by_the_gpu_run_of_its_very_build(
        demo: DemoWorkspace) -> None:
    """Evidence is keyed on what was tested, not on the folder (issue 41: a renamed copy
    verifies): a copy whose build is the original's wheels, sha256 for sha256, is backed by
    the original's GPU record, which ran them; a copy not built, or built otherwise, is not,
    and never by the original's verify-sm120 record (verify runs again for the copy)."""
    root = demo.ws.root
    stack = _copy(demo)
    wheels = demo.ws.stack_wheels("copy")
    wheels.mkdir(parents=True)
    for sha, state in (("b" * 64, "missing"), ("a" * 64, "current")):
        write_manifest(wheels, "copy", entry("lib", wheel=WHEEL, sha256=sha))
        copy = ResolvedStack.of(demo.ws, stack)  # built again: resolved again
        gpu = next(s for s in claim_standings(copy) if s.kind == "gpu-test")
        assert gpu.state == state, gpu.message()
    assert gpu.reasons == ("reports/demo/gpu-test ran this stack's very build",)
    record = next(s for s in stack_evidence(copy) if s.kind == "gpu-test")
    assert (record.name, record.state) == ("reports/demo/gpu-test", "current")
    cpu = next(s for s in claim_standings(copy) if s.kind == "verify-sm120")
    assert cpu.state == "missing"
    # verify-sm120 of the copy counts the same record, and says whose run it was
    patch = load_series(root / "patches" / "copy" / "lib").patches[1]
    ctx = Context(root=root, stack="copy", today=ResolvedStack.of(demo.ws, stack))
    text, ok = check_gpu_report(ctx, "gpu-test", patch, "lib")
    assert ok, text
    assert text.startswith("reports/demo/gpu-test (this very build, ran as stack demo): pass")
    write_manifest(wheels, "copy", entry("lib", wheel=WHEEL, sha256="b" * 64))
    ctx = Context(root=root, stack="copy", today=ResolvedStack.of(demo.ws, stack))
    assert check_gpu_report(ctx, "gpu-test", patch, "lib") == (
        "reports/copy/gpu-test: no record.json", False)


def test_a_record_that_ran_another_plugin_wheel_than_the_one_built_is_stale(
        demo: DemoWorkspace) -> None:
    """The plugin route's record names the plugin wheel it ran (``<project>@plugin``): a
    plugin wheel built since with other content (its doctor changed) stales it; nothing
    built: judged on the patches alone, as CI does."""
    plugin = demo.ws.stack_wheels("demo") / "plugin" / "demo_plugin-1.0-py3-none-any.whl"
    plugin.parent.mkdir(parents=True)
    plugin.write_bytes(b"as it ran")
    tested = _tested(demo)
    tested = Tested(wheels=(*tested.wheels, TestedWheel(
        variant="plugin", project="lib@plugin", file=plugin.name,
        sha256=hashlib.sha256(b"as it ran").hexdigest())), patches=tested.patches)
    write(make(kind="sglang-layer", stack="demo", command="nox -s sglang_layer",
               created="2026-12-03T17:00:00+00:00", toolkit="0",
               machine=Machine(description="test"), tested=tested, planned=1,
               cases=(Case(id="a", variant="plugin", outcome="pass"),)), demo.ws.reports_dir)
    assert _stale(demo) == {}
    plugin.write_bytes(b"rebuilt with another doctor")
    assert list(_stale(demo)) == ["reports/demo/sglang-layer"]
    assert (f"the plugin wheel it ran (sha256 {tested.wheels[-1].sha256[:12]}) is not the "
            "one built now (wheels/demo/plugin: ") in _stale(demo)["reports/demo/sglang-layer"]
    shutil.rmtree(plugin.parent)
    assert _stale(demo) == {}


def test_a_gpu_claim_names_a_kind_of_record_not_another_stacks_folder(
        demo: DemoWorkspace) -> None:
    second = load_series(demo.series_dir("lib")).patches[1]
    second.path.write_text(second.path.read_text().replace(
        "gpu:gpu-test", "gpu:reports/other/gpu-test"))
    with pytest.raises(SeriesError, match="names a kind of record of the patch's own stack"):
        claim_standings(ResolvedStack.named(demo.ws, "demo"))


def test_status_lists_each_projects_records_and_claims(demo: DemoWorkspace) -> None:
    from sm120fork.maintain.status import stack_standings

    records, claims = stack_standings(ResolvedStack.named(demo.ws, "demo"))
    assert [r.name for r in records["lib"]] == ["reports/demo/gpu-test",
                                                "reports/demo/verify-sm120"]
    assert all(r.current for r in records["lib"])
    assert len(claims["lib"]) == 2
    assert claims["app"] == ()
