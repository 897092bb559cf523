"""``tune`` on CPU: the doctor's facts of committed boxes, a fake bench, a fake terminal."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sm120fork import record
from sm120fork.errors import UsageError
from sm120fork.gpu import policy
from sm120fork.gpu.core.documents import BenchRecord
from sm120fork.tune.run import Box, Tuned, TuneOptions, WorldBench, tune
from sm120fork.util import typed

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "reports" / "doctor" / "scenarios"
TOKENS = (1, 16, 128)
HIDDEN = (4096, 7168)
METHODS = ("fused_auto", "pcie_ipc_rmsnorm", "nccl_rmsnorm", "b12x_fused")


def facts(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCENARIOS / name / "facts.json").read_text())
    return data


def _bench_of(tp: int, *, shared: bool = False, finished: bool = True) -> WorldBench:
    """Our fused path wins below 128 tokens, pcie_ipc at 128; b12x cannot run."""
    recs: list[BenchRecord] = [{"kind": "method", "method": "b12x_fused",
                                "status": "not_runnable",
                                "reason": "b12x does not import here: /home/o/b12x"}]
    for t in TOKENS:
        for h in HIDDEN:
            for method, us in (("fused_auto", 4.0 + t / 8), ("pcie_ipc_rmsnorm", 9.0 + t / 64),
                               ("nccl_rmsnorm", 20.0 + t / 16)):
                recs.append({"kind": "point", "method": method, "tokens": t, "hidden": h,
                             "status": "timed", "median_us": us * tp / 2,
                             "rank_medians_us": [us * tp / 2] * tp})
    return WorldBench(world=tp, records=recs, tokens=TOKENS, hidden=HIDDEN, methods=METHODS,
                      finished=finished, shared=shared,
                      failure=None if finished else "rank 3 exited with code 1",
                      flashinfer="0.7.2",
                      wheel=("flashinfer_python-0.7.2-py3-none-any.whl", "ab" * 32))


class FakeBox:
    """The doctor answers with a committed box's facts; the bench with _bench_of."""

    def __init__(self, tmp: Path, scenario: str, *,
                 bench: Callable[[int], WorldBench] = _bench_of,
                 answers: list[bool] | None = None, terminal: bool = True) -> None:
        self.asked_tp: list[int] = []
        self.questions: list[str] = []
        self.stopped = 0
        self.answers = list(answers or [])
        self.now = 0.0
        self.target = tmp / "home" / "allreduce-policy.json"

        def run(tp: int, left: float | None) -> WorldBench:
            self.asked_tp.append(tp)
            self.now += 600
            return bench(tp)

        def ask(question: str) -> bool:
            self.questions.append(question)
            return self.answers.pop(0)

        def stop() -> None:
            self.stopped += 1

        self.box = Box(doctor=lambda: facts(scenario), bench=run,
                       ask=ask if terminal else None, stop=stop,
                       environ={policy.ENV_VAR: str(self.target)}, clock=lambda: self.now)


def run_tune(tmp: Path, fake: FakeBox, **opts: Any) -> Tuned:
    return tune(TuneOptions(stack="sglang-0.5.23", command="nox -s tune -- --stack "
                            "sglang-0.5.23", reports=tmp / "reports", **opts), fake.box)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


def test_tune_measures_what_the_doctor_allows_installs_and_records(tmp: Path) -> None:
    fake = FakeBox(tmp, "8x-rtx-pro-6000-pcie-cross-socket-p2p-off")
    done = run_tune(tmp, fake)
    assert fake.asked_tp == [2, 4]          # TP8: no P2P across the sockets
    assert done.measured == (2, 4)
    assert done.not_covered == {8: "doctor: GPU 0 cannot access GPU 4 (no P2P)"}
    assert not done.cut_short
    assert done.installed == fake.target
    installed = policy.load(fake.target)
    assert installed["for_use"] is True
    assert sorted(installed["tp"]) == ["2", "4"]
    assert [(r["min_tokens"], r["max_tokens"], r["method"])
            for r in installed["tp"]["2"]["ranges"]] == [(1, 16, "fused_auto"),
                                                          (17, 128, "pcie_ipc_rmsnorm")]
    assert installed["made"]["stack"] == "sglang-0.5.23"
    # the record: facts and measurements, no path of the box
    folder = tmp / "reports" / "sglang-0.5.23" / "policy"
    assert done.record_dir == folder
    rec = record.read(folder / "record.json")
    assert (rec.kind, rec.verdict, rec.finished) == ("policy", "pass", True)
    assert rec.planned == 2 * (len(METHODS) * len(TOKENS) * len(HIDDEN) + 1)
    assert rec.counts == {"pass": 38, "fail": 0, "skip": 12, "error": 0}
    assert rec.machine.description == "NVIDIA RTX PRO 6000 Blackwell Server Edition x8"
    # the doctor's driver fact is a CUDA version, not a driver release: a record says so
    assert rec.machine.driver == "supports CUDA 13.0"
    b12x = [c for c in rec.cases if "b12x" in c.id]
    assert b12x[0].detail == "b12x does not import here: <path>"
    assert "TP8: doctor: GPU 0 cannot access GPU 4 (no P2P)" in rec.not_run
    assert record.machine_paths(rec) == []
    assert policy.load(folder / "policy.json") == installed
    assert any(line.startswith("installed the policy at ") for line in done.lines())
    # and how to see SGLang's own start-up decision for exactly the sizes measured
    assert ("what SGLang's own start-up code now decides: the doctor with --tp 2 --tp 4 "
            "(in the environment SGLang serves from)") in done.lines()


def test_an_installed_policy_is_replaced_only_when_the_owner_says_yes(tmp: Path) -> None:
    scenario = "2x-rtx-pro-6000-one-socket"
    fake = FakeBox(tmp, scenario, answers=[False])
    fake.target.parent.mkdir(parents=True)
    fake.target.write_text("{\"theirs\": true}\n")
    kept = run_tune(tmp, fake)
    assert fake.questions == [f"a policy is installed at {fake.target}; replace it with "
                              "this measurement? [y/N] "]
    assert kept.installed is None
    assert fake.target.read_text() == "{\"theirs\": true}\n"
    assert kept.kept is not None
    assert "you said no" in kept.kept
    assert (kept.record_dir / "policy.json").is_file()   # there to copy by hand
    yes = FakeBox(tmp, scenario, answers=[True])
    assert run_tune(tmp, yes).installed == fake.target
    assert policy.load(fake.target)["tp"]["2"]["ranges"]


def test_without_a_terminal_only_yes_replaces(tmp: Path) -> None:
    scenario = "2x-rtx-pro-6000-one-socket"
    fake = FakeBox(tmp, scenario, terminal=False)
    fake.target.parent.mkdir(parents=True)
    fake.target.write_text("{}\n")
    done = run_tune(tmp, fake)
    assert done.installed is None
    assert "no terminal to ask on" in str(done.kept)
    assert fake.target.read_text() == "{}\n"
    forced = FakeBox(tmp, scenario, terminal=False)
    assert run_tune(tmp, forced, yes=True).installed == fake.target


def test_a_run_cut_short_installs_only_what_it_measured(tmp: Path) -> None:
    def bench(tp: int) -> WorldBench:
        if tp == 4:
            raise KeyboardInterrupt
        return _bench_of(tp)

    fake = FakeBox(tmp, "8x-rtx-pro-6000-pcie-cross-socket-p2p-off", bench=bench)
    done = run_tune(tmp, fake)
    assert done.interrupted
    assert done.cut_short
    assert fake.stopped == 1
    assert done.measured == (2,)
    assert done.not_covered[4] == "interrupted while it ran"
    assert sorted(policy.load(fake.target)["tp"]) == ["2"]
    assert ("not in the policy: TP4: interrupted while it ran (SGLang keeps today's rule "
            "there)") in done.lines()
    rec = record.read(done.record_dir / "record.json")
    assert rec.verdict == "unfinished"
    assert "TP4: interrupted while it ran" in rec.not_run


def test_a_size_whose_bench_did_not_finish_is_left_out(tmp: Path) -> None:
    fake = FakeBox(tmp, "4x-one-pcie-switch",
                   bench=lambda tp: _bench_of(tp, finished=tp != 4))
    done = run_tune(tmp, fake)
    assert done.measured == (2,)
    assert done.not_covered == {4: "the bench did not finish: rank 3 exited with code 1"}
    assert sorted(policy.load(fake.target)["tp"]) == ["2"]


def test_the_time_budget_stops_before_the_next_size(tmp: Path) -> None:
    fake = FakeBox(tmp, "4x-one-pcie-switch")
    done = run_tune(tmp, fake, time_budget=300)
    assert fake.asked_tp == [2]       # the fake bench took 600 s
    assert done.not_covered == {4: "not reached: the time budget was used up"}
    assert sorted(policy.load(fake.target)["tp"]) == ["2"]


def test_nothing_measured_installs_nothing(tmp: Path) -> None:
    fake = FakeBox(tmp, "4x-one-pcie-switch", bench=lambda tp: _bench_of(tp, finished=False))
    done = run_tune(tmp, fake)
    assert (done.measured, done.installed, done.policy) == ((), None, None)
    assert not fake.target.exists()
    assert record.read(done.record_dir / "record.json").verdict == "unfinished"


def test_one_gpu_needs_asked_sizes_and_a_shared_run_is_installed_not_for_use(
        tmp: Path) -> None:
    fake = FakeBox(tmp, "dgx-spark-sm121-single-gpu",
                   bench=lambda tp: _bench_of(tp, shared=True))
    with pytest.raises(UsageError) as err:
        run_tune(tmp, fake)
    assert "pass --world-sizes 2" in err.value.message
    done = run_tune(tmp, fake, world_sizes=(2,))
    assert done.measured == (2,)
    installed = policy.load(fake.target)
    assert installed["for_use"] is False
    assert "not for use" in installed["made"]["note"]


def test_the_verb_runs_the_library_and_says_what_it_did(
        tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sm120fork.cli.main import main
    from sm120fork.tune import cli

    monkeypatch.setattr(cli, "ready", lambda: None)   # the GPU preflight: no GPU here
    monkeypatch.setattr("sm120fork.doctor.probe.collect",
                        lambda: facts("2x-rtx-pro-6000-one-socket"))
    monkeypatch.setattr(cli, "_bench", lambda args, command, stack: lambda tp, left: _bench_of(tp))
    monkeypatch.setattr(cli, "_tested", lambda args, stack: None)  # the stack's build: none here
    monkeypatch.setenv(policy.ENV_VAR, str(tmp / "p.json"))
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")  # the noxfile sets it
    rc = main(["tune", "--stack", "sglang-0.5.23", "--reports", str(tmp / "r"), "--yes"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "measured: TP2" in out
    assert f"installed the policy at {tmp / 'p.json'}" in out
    rec = record.read(tmp / "r" / "sglang-0.5.23" / "policy" / "record.json")
    assert rec.command == "nox -s tune -- --stack sglang-0.5.23 --reports <path> --yes"


def test_a_bench_that_fails_stops_the_run_and_says_so(tmp: Path) -> None:
    from sm120fork.errors import VerifyError

    def bench(tp: int) -> WorldBench:
        raise VerifyError("JIT build failed for patched")

    fake = FakeBox(tmp, "4x-one-pcie-switch", bench=bench)
    done = run_tune(tmp, fake)
    assert fake.asked_tp == [2]
    assert done.not_covered == {2: "the bench failed: JIT build failed for patched",
                                4: "not reached: the bench failed before it"}
    assert done.installed is None
    assert not fake.target.exists()


def test_the_verb_benches_a_given_wheel_and_records_the_command_it_was_given(
        tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The offline kit's ``run tune``: --wheel-dir instead of the checkout's wheels/, and
    the record names the kit's command (SM120FORK_COMMAND), not this box's paths."""
    from sm120fork.cli.main import main
    from sm120fork.gpu.bench import run as runs
    from sm120fork.tune import cli

    seen: list[runs.BenchOptions] = []

    def run_bench(opts: runs.BenchOptions) -> None:
        seen.append(opts)
        assert opts.out is not None
        opts.out.mkdir(parents=True)
        bench = _bench_of(2)
        (opts.out / "bench.json").write_text(json.dumps({
            "records": bench.records, "plan": {"tokens": list(bench.tokens),
                                              "hidden": list(bench.hidden)},
            "methods": list(bench.methods), "finished": True, "shared": False,
            "wheel": "fi.whl", "sha256": "c" * 64}))

    monkeypatch.setattr(cli, "ready", lambda: None)
    monkeypatch.setattr("sm120fork.doctor.probe.collect",
                        lambda: facts("2x-rtx-pro-6000-one-socket"))
    monkeypatch.setattr(runs, "run_bench", run_bench)
    monkeypatch.setenv(policy.ENV_VAR, str(tmp / "p.json"))
    monkeypatch.setenv("SM120FORK_COMMAND", "sh '<kit sglang-0.5.23>/run' tune --yes")
    # what the kit's build was made from, beside its wheel: the record is keyed on it
    built = record.Tested(patches=(record.TestedPatch(project="flashinfer", patch="0001-F1.patch",
                                                      patch_id="a" * 40),),
                          trees=(record.TestedTree(project="flashinfer", tree="b" * 40),))
    (tmp / "tested.json").write_text(json.dumps(typed.dump(built)))
    rc = main(["tune", "--stack", "sglang-0.5.23", "--wheel-dir", f"patched={tmp / 'fi.whl'}",
               "--prebuilt", f"patched={tmp / 'pre'}", "--work-dir", str(tmp / "w"),
               "--reports", str(tmp / "r"), "--yes"])
    assert rc == 0, capsys.readouterr().out
    assert [(o.stack, o.wheel_dirs, o.prebuilt) for o in seen] == [
        (None, {"patched": tmp / "fi.whl"}, {"patched": tmp / "pre"})]
    rec = record.read(tmp / "r" / "sglang-0.5.23" / "policy" / "record.json")
    assert rec.command == "sh '<kit sglang-0.5.23>/run' tune --yes"
    # (issue 41: a record naming the wheel alone was stale from the day it was made)
    assert (rec.tested.patches, rec.tested.trees) == (built.patches, built.trees)


def test_a_failed_check_and_an_error_are_recorded_as_such(tmp: Path) -> None:
    """A method that failed its output check at a point is a failing case, one whose run
    errored an error case, each with the bench's reason (or what it means, if none)."""
    def bench(tp: int) -> WorldBench:
        done = _bench_of(tp)
        bad: list[BenchRecord] = [
            {"kind": "point", "method": "pcie_ipc_rmsnorm", "tokens": 1, "hidden": 4096,
             "status": "failed_check", "reason": "rel L2 0.9 > 0.015 in /tmp/x"},
            {"kind": "point", "method": "pcie_ipc_rmsnorm", "tokens": 16, "hidden": 4096,
             "status": "failed_check"},
            {"kind": "point", "method": "nccl_rmsnorm", "tokens": 1, "hidden": 4096,
             "status": "error", "reason": "RuntimeError: NCCL timeout"}]
        keep = [r for r in done.records if not any(
            r.get("method") == b["method"] and r.get("tokens") == b["tokens"]
            and r.get("hidden") == b["hidden"] for b in bad)]
        return WorldBench(world=tp, records=keep + bad, tokens=TOKENS, hidden=HIDDEN,
                          methods=METHODS, finished=True, shared=False)

    run_tune(tmp, FakeBox(tmp, "2x-rtx-pro-6000-one-socket", bench=bench))
    rec = record.read(tmp / "reports" / "sglang-0.5.23" / "policy" / "record.json")
    by_id = {c.id: (c.outcome, c.detail) for c in rec.cases}
    assert by_id["tp2/pcie_ipc_rmsnorm/t1/h4096"] == ("fail", "rel L2 0.9 > 0.015 in <path>")
    assert by_id["tp2/pcie_ipc_rmsnorm/t16/h4096"] == ("fail", "output check failed")
    assert by_id["tp2/nccl_rmsnorm/t1/h4096"] == ("error", "RuntimeError: NCCL timeout")
    assert by_id["tp2/fused_auto/t1/h4096"][0] == "pass"
