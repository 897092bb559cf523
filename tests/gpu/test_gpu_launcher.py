"""Watchdog and batch restarts, with dummy rank scripts that pass, crash and hang."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers_proc import HANGING_CHILD, sigterm_ends_every_child
from sm120fork.errors import ConfigError
from sm120fork.gpu.ab import run as ab_run
from sm120fork.gpu.core import runs, variants
from sm120fork.gpu.core.cases import Case
from sm120fork.gpu.core.variants import Timeouts
from sm120fork.util import proc, wire
from sm120fork.util.files import sha256_file

FAKE_RANK = textwrap.dedent("""\
    import json, os, sys, time
    from sm120fork.util.wire import encode
    spec = json.load(open(sys.argv[1])); rank = int(sys.argv[2])
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    for c in spec["cases"]:
        key = "{api}/{pattern}/ws{world_size}/t{tokens}/h{hidden}/{dtype}/{strategy}/pdl{p}".format(
            p=int(c["pdl"]), **c)
        print(encode("START", key), flush=True)
        print("working on", key, flush=True)
        if c["tokens"] == 13:          # rank 1 dies with a CUDA error, rank 0 spins forever
            if rank == 1:
                print("CUDA error: an illegal memory access was encountered", flush=True)
                sys.exit(3)
            time.sleep(600)
        if c["tokens"] == 14:          # every rank hangs silently
            time.sleep(600)
        status = "fail" if c["tokens"] == 15 and rank == 0 else "pass"
        print(encode("RESULT", {"key": key, "rank": rank, "status": status,
              "failure": None if status == "pass" else "wrong result",
              "checks": [{"output": "norm_out", "stage": "eager", "ok": status == "pass",
                          "rel_l2": 0.5 if status == "fail" else 1e-3,
                          "reason": "rel L2 0.5 > 0.015" if status == "fail" else ""}]}),
              flush=True)
    print(encode("DONE"), flush=True)
""")


def _cases(*tokens: int) -> list[Case]:
    return [Case(world_size=2, api="fusion_legacy", pattern="ar_rmsnorm", tokens=t,
                 hidden=256, dtype="bf16", strategy="oneshot", pdl=False) for t in tokens]


@pytest.fixture
def fake(tmp_path: Path) -> tuple[list[str], variants.Variant]:
    script = tmp_path / "fake_rank.py"
    script.write_text(FAKE_RANK)
    variant = variants.Variant(name="v", wheel=None, sha256=None, site=None,
                               jit_base=tmp_path / "jit")
    return [sys.executable, str(script)], variant


FAST = Timeouts(startup=20.0, idle=1.5)


def test_all_pass_in_one_group(tmp_path: Path, fake: tuple[list[str], variants.Variant]
                               ) -> None:
    worker, variant = fake
    out = ab_run.run_cases(_cases(1, 2, 3), variant, tmp_path, timeouts=FAST, worker=worker)
    assert [r.status for r in out] == ["pass", "pass", "pass"]
    assert len(list(tmp_path.glob("spec-*.json"))) == 1


def test_crash_is_recorded_and_the_run_continues(
        tmp_path: Path, fake: tuple[list[str], variants.Variant]) -> None:
    worker, variant = fake
    out = ab_run.run_cases(_cases(1, 13, 2, 15), variant, tmp_path, timeouts=FAST,
                             worker=worker)
    by_tokens = {r.case.tokens: r for r in out if r.case}
    assert by_tokens[1].status == "pass"
    crashed = by_tokens[13]
    assert crashed.status == "fail"
    assert crashed.failure == "crash"
    assert "rank 1 exited with code 3" in (crashed.reason or "")
    assert any("illegal memory access" in line for line in (crashed.log_tail or {})["rank1"])
    assert by_tokens[2].status == "pass"  # ran in a fresh group after the crash
    wrong = by_tokens[15]
    assert wrong.status == "fail"
    assert wrong.failure == "wrong result"
    assert wrong.failing_ranks == (0,)


def test_hang_is_ended_by_the_watchdog(tmp_path: Path,
                                       fake: tuple[list[str], variants.Variant]) -> None:
    worker, variant = fake
    out = ab_run.run_cases(_cases(14, 1), variant, tmp_path, timeouts=FAST, worker=worker)
    hung, after = out
    assert hung.status == "fail"
    assert hung.failure == "hang"
    assert "watchdog" in (hung.reason or "")
    assert any("working on" in line for line in (hung.log_tail or {})["rank0"])
    assert after.status == "pass"


def test_ranks_that_cannot_start_fail_every_case_once(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('ImportError: no flashinfer')\nsys.exit(1)\n")
    variant = variants.Variant(name="v", wheel=None, sha256=None, site=None, jit_base=tmp_path)
    out = ab_run.run_cases(_cases(1, 2), variant, tmp_path, timeouts=FAST,
                             worker=[sys.executable, str(script)])
    assert [r.status for r in out] == ["fail", "fail"]
    assert "failed twice" in (out[0].reason or "")
    assert len(list(tmp_path.glob("spec-*.json"))) == 2


def test_fatal_line_stops_without_retry(tmp_path: Path) -> None:
    script = tmp_path / "fatal.py"
    line = wire.encode("FATAL", "no P2P between GPU 0 and 1")
    script.write_text(f"import sys, time\nprint({line!r}, flush=True)\ntime.sleep(600)\n")
    variant = variants.Variant(name="v", wheel=None, sha256=None, site=None, jit_base=tmp_path)
    out = ab_run.run_cases(_cases(1, 2), variant, tmp_path, timeouts=FAST,
                             worker=[sys.executable, str(script)])
    assert all(r.status == "fail" and "no P2P" in (r.reason or "") for r in out)
    assert len(list(tmp_path.glob("spec-*.json"))) == 1


def _children(cmds: list[list[str]], tmp_path: Path) -> list[proc.Child]:
    return [proc.Child(argv=cmd, env={}, log=tmp_path / name)
            for cmd, name in zip(cmds, "ab", strict=False)]


def test_run_group_without_fail_fast_waits_for_all(tmp_path: Path) -> None:
    cmds = [[sys.executable, "-c", "import sys; sys.exit(2)"],
            [sys.executable, "-c", "import time; time.sleep(0.5); print('done')"]]
    outcome = proc.run_group(_children(cmds, tmp_path),
                                  timeouts=proc.Timeouts(idle=10, startup=10),
                                  fail_fast=False)
    assert outcome.returncodes == [2, 0]
    assert not outcome.ok
    assert outcome.tails[1] == ["done"]


def test_a_rank_that_starts_slower_than_the_other_is_not_a_hang(tmp_path: Path) -> None:
    """Rank 0 is up and waits (silent) for rank 1, which is still starting: the startup
    bound holds until every rank has spoken; the idle bound only after that."""
    cmds = [[sys.executable, "-c", "import time; print('up', flush=True); time.sleep(2.5); "
                                   "print('joined', flush=True)"],
            [sys.executable, "-c", "import time; time.sleep(2.0); print('up', flush=True)"]]
    outcome = proc.run_group(_children(cmds, tmp_path),
                                  timeouts=proc.Timeouts(idle=1.0, startup=60))
    assert outcome.ok, outcome.failure
    assert outcome.tails == [["up", "joined"], ["up"]]


def test_ranks_that_have_all_spoken_and_go_silent_are_a_hang(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
    outcome = proc.run_group(_children([cmd, cmd], tmp_path),
                                  timeouts=proc.Timeouts(idle=1.0, startup=60))
    assert outcome.kind == "hang", outcome.failure


def test_variant_specs() -> None:
    assert runs.parse_variant_specs(["patched=a", "unpatched=b/c"]) == {
        "patched": Path("a"), "unpatched": Path("b/c")}
    with pytest.raises(ConfigError, match="NAME=DIR"):
        runs.parse_variant_specs(["patched"])
    with pytest.raises(ConfigError, match="twice"):
        runs.parse_variant_specs(["a=x", "a=y"])


def test_variant_env_isolates_import_path_and_jit_cache(tmp_path: Path) -> None:
    v = variants.Variant(name="p", wheel=None, sha256=None, site=tmp_path / "site",
                         jit_base=tmp_path / "jit")
    env = v.env({"PYTHONPATH": "/base", "NCCL_NVLS_ENABLE": "1"})
    parts = env["PYTHONPATH"].split(":")
    assert parts[0] == str(tmp_path / "site")
    assert parts[-1] == "/base"
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "jit")
    assert env["NCCL_NVLS_ENABLE"] == "0"


def test_find_wheel_needs_exactly_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        variants.find_flashinfer_wheel(tmp_path)
    wheel = tmp_path / "flashinfer_python-0.6.7.post3-py3-none-any.whl"
    wheel.write_bytes(b"x")
    assert variants.find_flashinfer_wheel(tmp_path) == wheel
    assert json.dumps(sha256_file(wheel))


def _fake_flashinfer_wheel(directory: Path) -> Path:
    """The smallest wheel pip accepts, named like FlashInfer's."""
    import base64
    import hashlib
    import zipfile

    files = {"flashinfer/__init__.py": b"__version__ = '0.0.1'\n",
             "flashinfer_python-0.0.1.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.0.1\n",
             "flashinfer_python-0.0.1.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(data)}")
    record.append("flashinfer_python-0.0.1.dist-info/RECORD,,")
    files["flashinfer_python-0.0.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / "flashinfer_python-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


def test_install_variant_with_prebuilt_modules(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_flashinfer_wheel(wheels)
    prebuilt = tmp_path / "prebuilt" / "trtllm_comm"
    prebuilt.mkdir(parents=True)
    (prebuilt / "trtllm_comm.so").write_bytes(b"\x7fELF")
    (prebuilt / "build.ninja").write_text("ignored")
    (prebuilt / "trtllm_comm.so.sources").write_text("sha256:" + "1" * 64 + "\n")
    v = variants.install_variant("patched", wheels, tmp_path / "work", prebuilt.parent)
    assert v.site is not None
    assert (v.site / "flashinfer" / "__init__.py").is_file()
    assert v.aot_modules == ("trtllm_comm",)
    aot = v.site / "flashinfer" / "data" / "aot" / "trtllm_comm" / "trtllm_comm.so"
    assert aot.read_bytes() == b"\x7fELF"
    # the sources digest travels with the module (a patched FlashInfer checks it)
    assert aot.with_name("trtllm_comm.so.sources").read_text() == "sha256:" + "1" * 64 + "\n"
    assert not aot.with_name("build.ninja").exists()
    assert v.sha256 == sha256_file(wheels / "flashinfer_python-0.0.1-py3-none-any.whl")
    plain = v.without_prebuilt()
    assert plain.aot_modules == ()
    assert not aot.exists()
    with pytest.raises(ConfigError, match="module"):
        variants.install_variant("x", wheels, tmp_path / "work", tmp_path / "wheels")


def test_time_budget_ends_a_hung_group_and_reports_the_rest_as_not_run(
        tmp_path: Path, fake: tuple[list[str], variants.Variant]) -> None:
    worker, variant = fake
    budget = Timeouts(startup=20.0, idle=60.0, deadline=time.monotonic() + 8.0)
    out = ab_run.run_cases(_cases(1, 14, 2), variant, tmp_path, timeouts=budget,
                             worker=worker)
    assert [r.status for r in out] == ["pass", "skip", "skip"]
    assert "time budget" in (out[1].reason or "")


def test_circuit_breaker_stops_one_api_after_repeated_hangs(
        tmp_path: Path, fake: tuple[list[str], variants.Variant]) -> None:
    worker, variant = fake
    hangs = [Case(world_size=2, api="fusion_legacy", pattern="ar_rmsnorm", tokens=14,
                  hidden=h, dtype="bf16", strategy="oneshot", pdl=False) for h in (256, 512, 1024)]
    other = Case(world_size=2, api="custom_lamport", pattern="ar_rmsnorm", tokens=1, hidden=256,
                 dtype="bf16", strategy="oneshot", pdl=False)
    quick = Timeouts(startup=20.0, idle=1.0, max_hang_streak=2)
    out = {r.key: r for r in ab_run.run_cases([*hangs, other], variant, tmp_path,
                                                    timeouts=quick, worker=worker)}
    kinds = [out[c.key].failure for c in hangs]
    assert kinds == ["hang", "hang", "not attempted"]
    assert "circuit breaker" in (out[hangs[2].key].reason or "")
    assert out[other.key].status == "pass"


def test_crash_after_a_reported_case_is_not_a_startup_failure(tmp_path: Path) -> None:
    """A rank that reports a CUDA error for its case and then exits (poisoned context)
    must not make the launcher give up on the remaining cases."""
    script = tmp_path / "poisoned.py"
    script.write_text(FAKE_RANK.replace(
        '\nprint(encode("DONE"), flush=True)',
        '\n    if c["tokens"] == 12:\n        sys.exit(3)\nprint(encode("DONE"), flush=True)'))
    variant = variants.Variant(name="v", wheel=None, sha256=None, site=None, jit_base=tmp_path)
    cases = [Case(world_size=2, api="custom_lamport", pattern="ar_rmsnorm", tokens=12,
                  hidden=h, dtype="bf16", strategy="oneshot", pdl=False) for h in (256, 512, 768)]
    # No case here hangs, so no timeout decides the outcome: generous ones keep a loaded
    # machine's slow interpreter starts from reading as hangs.
    out = ab_run.run_cases([*cases, *_cases(1)], variant, tmp_path,
                             timeouts=Timeouts(startup=120.0, idle=60.0),
                             worker=[sys.executable, str(script)])
    assert [r.status for r in out] == ["pass", "pass", "pass", "pass"]
    assert len(list(tmp_path.glob("spec-*.json"))) == 4


def test_a_rank_that_reports_and_exits_does_not_cut_off_the_others_report(
        tmp_path: Path) -> None:
    """The race behind the flaky test above, made certain: rank 0 reports its case and
    exits at once (a poisoned CUDA context), rank 1 reports the same case a moment later
    (a loaded machine).  Rank 1's report still counts: the case passes, and the crash,
    which came after the case, is blamed on no case."""
    script = tmp_path / "late.py"
    script.write_text(FAKE_RANK.replace(
        '\n        status = "fail" if', '\n        if rank == 1:\n            time.sleep(1.5)'
        '\n        status = "fail" if').replace(
        '\nprint(encode("DONE"), flush=True)',
        '\n    if rank == 0:\n        sys.exit(3)\nprint(encode("DONE"), flush=True)'))
    variant = variants.Variant(name="v", wheel=None, sha256=None, site=None, jit_base=tmp_path)
    out = ab_run.run_cases(_cases(1, 2), variant, tmp_path,
                             timeouts=Timeouts(startup=120.0, idle=60.0),
                             worker=[sys.executable, str(script)])
    assert [(r.status, r.failure) for r in out] == [("pass", None), ("pass", None)]
    assert len(list(tmp_path.glob("spec-*.json"))) == 2


def test_a_variant_records_its_wheels_record_digest(tmp_path: Path) -> None:
    """A rezipped published wheel keeps its RECORD: the digest that ties it to the original."""
    import hashlib
    import zipfile

    from sm120fork.util.files import wheel_record_sha256 as record_sha256

    record = b"flashinfer/__init__.py,sha256=abc,1\n"
    wheels = []
    for i, method in enumerate((zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED)):
        wheel = tmp_path / f"{i}" / "flashinfer_python-1.0-py3-none-any.whl"
        wheel.parent.mkdir()
        with zipfile.ZipFile(wheel, "w", method) as zf:
            zf.writestr("flashinfer/__init__.py", "x = 1\n")
            zf.writestr("flashinfer_python-1.0.dist-info/RECORD", record)
        wheels.append(wheel)
    assert wheels[0].read_bytes() != wheels[1].read_bytes()
    assert record_sha256(wheels[0]) == record_sha256(wheels[1]) == hashlib.sha256(
        record).hexdigest()
    assert record_sha256(tmp_path / "missing.whl") is None


def test_a_rank_on_another_wire_version_fails_the_cases_naming_the_rank_and_line(
        tmp_path: Path) -> None:
    """The A/B ranks speak the one wire format: a line with its marker that is not a
    message of this version ends the group at once and every case says which rank
    printed which line (before, an old rank's lines were ordinary output and the cases
    hung until the watchdog)."""
    script = tmp_path / "old.py"
    script.write_text(FAKE_RANK.replace('print(encode("RESULT", {',
                                        'print("@@sm120fork/0 RESULT " + json.dumps({'))
    variant = variants.Variant(name="v", wheel=None, sha256=None, site=None, jit_base=tmp_path)
    out = ab_run.run_cases(_cases(1, 2), variant, tmp_path,
                             timeouts=Timeouts(startup=120.0, idle=60.0),
                             worker=[sys.executable, str(script)])
    assert [r.status for r in out] == ["fail", "fail"]
    assert "rank " in (out[0].reason or "")
    assert '@@sm120fork/0 RESULT {"key": "fusion_legacy/' in (out[0].reason or "")
    assert "version '0'" in (out[0].reason or "")
    assert len(list(tmp_path.glob("spec-*.json"))) == 1  # not retried


def test_sigterm_to_the_launcher_ends_every_rank_with_its_process_group(tmp_path: Path) -> None:
    worker = tmp_path / "hanging.py"
    worker.write_text(HANGING_CHILD)
    parent = textwrap.dedent(f"""\
        import sys
        from pathlib import Path
        from sm120fork.gpu.ab import run as ab_run
        from sm120fork.gpu.core import variants
        from sm120fork.gpu.core.cases import Case
        from sm120fork.gpu.core.variants import Timeouts
        tmp = Path({str(tmp_path)!r})
        variant = variants.Variant(name="v", wheel=None, sha256=None, site=None, jit_base=tmp)
        case = Case(world_size=2, api="fusion_legacy", pattern="ar_rmsnorm", tokens=1,
                    hidden=256, dtype="bf16", strategy="oneshot", pdl=False)
        ab_run.run_cases([case], variant, tmp, worker=[sys.executable, {str(worker)!r}],
                           timeouts=Timeouts())
        """)
    sigterm_ends_every_child(parent, tmp_path / "marks", children=2)
