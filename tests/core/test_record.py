"""The evidence record (RECORD-FORMAT.md): strict reader, writer, rules, import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers_manifest import entry
from sm120fork import record
from sm120fork.cli.main import main
from sm120fork.errors import ConfigError
from sm120fork.manifest import Manifest
from sm120fork.record import Case, Machine, Tested, TestedPatch, TestedWheel
from sm120fork.util import typed

SHA = "a" * 64
PATCH_ID = "b" * 40


def _record(**over: Any) -> record.Record:
    fields: dict[str, Any] = {
        "kind": "gpu-test", "stack": "sglang-0.5.10",
        "command": "nox -s gpu_test -- --stack sglang-0.5.10 --quick",
        "created": "2026-12-03T17:00:00+00:00", "toolkit": "0.1.0",
        "machine": Machine(description="NVIDIA H200 x1", gpus=("NVIDIA H200",),
                           capability="9.0", shared_gpu=True),
        "tested": Tested(
            wheels=(TestedWheel(variant="patched", project="flashinfer",
                                file="flashinfer_python-0.6.7.post3+sm120.1-py3-none-any.whl",
                                sha256=SHA),),
            patches=(TestedPatch(project="flashinfer", patch="0002-x.patch",
                                 patch_id=PATCH_ID),)),
        "planned": 2,
        "cases": (Case(id="custom_lamport/bf16/ws2", variant="patched", outcome="pass",
                       detail="rel_l2 2.3e-3", against="fixed"),
                  Case(id="fp4/ws2", variant="patched", outcome="skip",
                       detail="needs sm_100 or newer")),
    }
    fields.update(over)
    return record.make(**fields)


def test_a_record_round_trips_and_its_summary_says_the_verdict(tmp_path: Path) -> None:
    rec = _record()
    assert (rec.finished, rec.verdict, rec.counts["pass"], rec.counts["skip"]) == (
        True, "pass", 1, 1)
    folder = record.write(rec, tmp_path / "reports")
    assert folder == tmp_path / "reports" / "sglang-0.5.10" / "gpu-test"
    text = (folder / "record.json").read_text()
    assert text.endswith("}\n")
    assert json.loads(text)["format"] == record.FORMAT
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=1) + "\n"
    assert record.read(folder / "record.json") == rec
    summary = (folder / "summary.md").read_text()
    assert "**pass**" in summary
    assert "nox -s gpu_test -- --stack sglang-0.5.10 --quick" in summary


def test_a_run_whose_cases_were_all_skipped_fails() -> None:
    rec = _record(planned=1, cases=(Case(id="x", variant="patched", outcome="skip",
                                         detail="no GPU"),))
    assert rec.finished
    assert rec.verdict == "fail"


def test_a_run_that_left_cases_out_is_unfinished_and_a_skip_needs_a_reason() -> None:
    assert _record(planned=3).verdict == "unfinished"
    rec = _record(cases=(Case(id="a", variant="patched", outcome="pass"),
                         Case(id="b", variant="patched", outcome="skip")))
    assert not rec.finished


def test_the_baseline_failing_fails_nothing() -> None:
    rec = _record(cases=(Case(id="a", variant="patched", outcome="pass"),
                         Case(id="a", variant="upstream", outcome="fail")))
    assert rec.verdict == "pass"
    assert _record(cases=(Case(id="a", variant="patched", outcome="fail"),
                          Case(id="b", variant="patched", outcome="pass"))).verdict == "fail"


def _written(tmp_path: Path, edit: Any) -> Path:
    data = record.to_json(_record())
    edit(data)
    path = tmp_path / "in" / "record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("edit", "key", "message"), [
    (lambda d: d["tested"]["wheels"][0].pop("sha256"), "tested.wheels[0].sha256", "missing"),
    (lambda d: d["tested"]["wheels"][0].update(sha256="xyz"), "tested.wheels[0].sha256",
     "not a sha256"),
    (lambda d: d.update(planed=3), "planed", "did you mean 'planned'"),
    (lambda d: d["machine"].update(cpus="16"), "machine.cpus", "is str, not int"),
    (lambda d: d["cases"][0].update(outcome="passed"), "cases[0].outcome", "not one of"),
    (lambda d: d.update(verdict="pass", counts={"pass": 0, "fail": 0, "skip": 2, "error": 0},
                        cases=[{"id": "a", "variant": "patched", "outcome": "skip",
                                "detail": "no"}] * 2),
     "verdict", "all skipped"),
    (lambda d: d.update(finished=False), "finished", "planned cases ran"),
    (lambda d: d.update(kind="gpu_test"), "kind", "did you mean 'gpu-test'"),
    (lambda d: d.update(created="yesterday"), "created", "ISO 8601"),
    (lambda d: d.update(format="sm120fork-record/0"), "format", "is not"),
    (lambda d: d["notes"].append("log at /tmp/tmp.x1/run.log"), "notes[0]",
     "path of the machine"),
    (lambda d: d.update(command="/root/.venv/bin/python -m sm120fork gpu test"), "command",
     "path of the machine"),
])
def test_the_reader_names_the_file_and_the_dotted_key(tmp_path: Path, edit: Any, key: str,
                                                      message: str) -> None:
    path = _written(tmp_path, edit)
    with pytest.raises(ConfigError, match=message) as err:
        record.read(path)
    assert f"{path}: {key}" in str(err.value)


def test_every_kind_names_its_remake_command() -> None:
    assert record.KINDS["gpu-test"].command("s") == "nox -s gpu_test -- --stack s --quick"
    assert record.KINDS["verify-sm120"].command("s") == "nox -s verify_sm120 -- --stack s"
    assert record.KINDS["upstream-pr"].has_subjects
    for kind in record.KINDS.values():
        assert kind.remake.startswith("nox -s ") or kind.has_subjects
        assert kind.description
    scenario = _record(kind="gpu-scenario", subject="f5-cluster",
                       command="python -m sm120fork.gpu test --quick --out <out>")
    assert scenario.remake == "python -m sm120fork.gpu test --quick --out <out>"


def test_import_publishes_valid_records_and_refuses_all_on_one_bad(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from helpers_ws import make_demo

    demo = make_demo(tmp_path / "checkout")
    out = tmp_path / "box-out"
    record.write(_record(), out / "a")
    record.write(_record(kind="bench", command="nox -s bench -- --stack sglang-0.5.10"),
                 out / "b")
    (out / "a" / "sglang-0.5.10" / "gpu-test" / "run.log").write_text("console noise\n")
    assert main(["--root", str(demo.ws.root), "record", "import", str(out)]) == 0
    reports = demo.ws.root / "reports" / "sglang-0.5.10"
    assert sorted(p.relative_to(reports).as_posix() for p in reports.rglob("*")
                  if p.is_file()) == ["bench/record.json", "bench/summary.md",
                                      "gpu-test/record.json", "gpu-test/summary.md"]
    assert "published reports/sglang-0.5.10/bench/" in capsys.readouterr().out
    bad = out / "c" / "record.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({**record.to_json(_record()), "stack": "other",
                               "command": "/home/me/x"}))
    (reports / "bench" / "record.json").unlink()
    refused = main(["--root", str(demo.ws.root), "record", "import", str(out)])
    assert refused == ConfigError.exit_code
    assert not (reports / "bench" / "record.json").exists()  # nothing half-imported
    assert "c/record.json: command" in capsys.readouterr().err


def test_a_patch_listed_once_per_wheel_is_read_as_one_tested_patch(tmp_path: Path) -> None:
    """Records made before tested_of named each patch once list a multi-wheel build's
    patches once per wheel: read back, each is one fact, in the series' order."""
    from sm120fork import resolved

    manifest = Manifest.from_json({"stack": "s", "toolkit_version": "0", "wheels": [
        entry("p", patches=[{"name": n, "sha256": "0" * 64, "subject": n} for n in "ab"])]})
    rows = typed.dump(resolved.tested_of(manifest, {"p": [("a", "1" * 40),
                                                             ("b", "2" * 40)]}))["patches"]
    assert [r["patch"] for r in rows] == ["a", "b"]
    path = tmp_path / "tested.json"
    path.write_text(json.dumps({"patches": rows * 3}))
    got = record.read_tested(path)
    assert [p.patch for p in got.patches] == ["a", "b"]
