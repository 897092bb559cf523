"""Reports rendered from JSON: the A/B table, the bench table, projection and plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sm120fork.errors import ConfigError, UsageError
from sm120fork.gpu.ab import results as ab_report
from sm120fork.gpu.ab.results import AbRun
from sm120fork.gpu.bench import report as bench_report
from sm120fork.gpu.cli import main
from sm120fork.gpu.core import report as core_report
from sm120fork.gpu.core.documents import BenchDoc, parse_bench


def _rec(key: str, api: str, ws: int, status: str, **extra: Any) -> dict[str, Any]:
    case = {"api": api, "world_size": ws, "pattern": "ar_rmsnorm", "tokens": 8,
            "hidden": 4096, "dtype": "bf16", "strategy": "oneshot", "pdl": False}
    return {"key": key, "case": case, "status": status, **extra}


def _test_doc() -> AbRun:
    return AbRun.read(_test_data(), "test-ab.json")


def _test_data() -> dict[str, Any]:
    lam = "custom_lamport/ar_rmsnorm/ws2/t8/h4096/bf16/oneshot/pdl0"
    fus = "fusion_legacy/ar_rmsnorm/ws2/t8/h4096/bf16/oneshot/pdl0"
    reg = "fusion_unified/ar_rmsnorm/ws2/t8/h4096/bf16/oneshot/pdl0"
    skp = "fusion_legacy/ar_rmsnorm_fp4/ws2/t8/h4096/bf16/oneshot/pdl0"
    ok = [{"output": "norm_out", "stage": "eager", "ok": True, "rel_l2": 2.5e-3}]
    return {
        "kind": "gpu-test", "primary": "patched", "baseline": "unpatched", "shared": True,
        "environment": {"gpus": ["NVIDIA H200"], "gpu_count": 1, "torch": "2.11"},
        "variants": {"patched": {"wheel": "p.whl", "sha256": "ab" * 32},
                     "unpatched": {"wheel": "u.whl", "sha256": "cd" * 32}},
        "tolerances": [["bf16", "rel L2 <= 0.015"]],
        "results": {
            "patched": [_rec(lam, "custom_lamport", 2, "pass", checks=ok),
                        _rec(fus, "fusion_legacy", 2, "pass", checks=ok),
                        _rec(reg, "fusion_unified", 2, "fail", failure="wrong result",
                             reason="norm_out: rel L2 0.7 > 0.015"),
                        _rec(skp, "fusion_legacy", 2, "skip", reason="FP4 needs sm_100")],
            "unpatched": [_rec(lam, "custom_lamport", 2, "fail", failure="crash",
                               reason="rank 1 exited with code 3"),
                          _rec(fus, "fusion_legacy", 2, "pass", checks=ok),
                          _rec(reg, "fusion_unified", 2, "pass", checks=ok),
                          _rec(skp, "fusion_legacy", 2, "skip", reason="FP4 needs sm_100")],
        },
        "not_run": ["world size 8 on 8 GPUs: multi-GPU machines withheld"],
    }


def test_classify() -> None:
    assert ab_report.classify({"p": "pass", "u": "fail"}, "p", "u") == "fixed"
    assert ab_report.classify({"p": "fail", "u": "pass"}, "p", "u") == "regressed"
    assert ab_report.classify({"p": "pass", "u": "pass"}, "p", "u") == "pass both"
    assert ab_report.classify({"p": "fail", "u": "fail"}, "p", "u") == "fail both"
    assert ab_report.classify({"p": "skip", "u": "skip"}, "p", "u") == "skip"
    assert ab_report.classify({"p": "fail"}, "p", None) == "fail"


def test_ab_markdown_shows_fixed_regressed_and_lamport_cases() -> None:
    md = ab_report.render_test_markdown(_test_doc())
    fixed = md.split("## Cases the series fixes")[1].split("##")[0]
    assert "custom_lamport/ar_rmsnorm/ws2/t8" in fixed
    assert "FAIL (crash)" in fixed
    regressed = md.split("## Regressions")[1].split("##")[0]
    assert "fusion_unified/ar_rmsnorm/ws2/t8" in regressed
    lamport = md.split("## Legacy custom all-reduce")[1].split("##")[0]
    assert "rank 1 exited with code 3" in lamport
    assert "| custom_lamport | 2 | 1/0/0 | 0/1/0 | 1 | 0 | 0 | 0 |" in md
    assert "FP4 needs sm_100" in md
    assert "multi-GPU machines withheld" in md
    assert "Ranks shared GPUs" in md


def _bench_doc(shared: bool) -> BenchDoc:
    records: list[dict[str, Any]] = [
        {"kind": "meta", "fused_api": "fusion_unified", "skipped": {}, "replays": 30,
         "rotate": 8, "calls_per_buffer": 4},
        {"kind": "floor", "method": "empty_graph", "median_us": 2.0},
        {"kind": "floor", "method": "flag_handoff", "median_us": 3.0},
    ]
    for t in (1, 3, 8, 16, 64, 128):
        records.append({"kind": "point", "method": "fused_auto", "tokens": t, "hidden": 7168,
                        "median_us": 5.0 + t / 10, "rank_medians_us": [5.0 + t / 10, 6.0]})
        records.append({"kind": "point", "method": "nccl_rmsnorm", "tokens": t,
                        "hidden": 7168, "median_us": 20.0 + t / 10})
    return parse_bench({"kind": "gpu-bench", "shared": shared, "world_size": 8,
                        "dtype": "bf16",
                        "environment": {"gpus": ["NVIDIA H200"] * 8, "gpu_count": 8},
                        "records": records, "variant": "patched"}, "bench.json")


def test_bench_projection_uses_122_allreduces_and_slowest_rank() -> None:
    pts = bench_report.bench_points(_bench_doc(False))
    assert pts[7168]["fused_auto"][1] == 6.0  # max over ranks' medians
    rows = {r["tokens"]: r for r in bench_report.projection(pts)}
    assert rows[3]["unfused_ms"] == pytest.approx(20.3 * 122 / 1000)
    assert rows[1]["speedup"] == pytest.approx(20.1 / 6.0)


def test_targets_evaluated_only_when_not_shared() -> None:
    verdicts = dict(bench_report.target_checks(_bench_doc(False)))
    assert any(v.startswith("MET") for v in verdicts.values())
    assert verdicts["fused >= 1.5x NCCL+RMSNorm at 128 tokens"].startswith("MET")
    assert bench_report.op_floor(_bench_doc(False)) == 5.0
    shared = dict(bench_report.target_checks(_bench_doc(True)))
    assert all(bench_report.SHARED_LABEL in v for v in shared.values())


def test_bench_outputs_json_markdown_png(tmp_path: Path) -> None:
    paths = bench_report.write_bench_report(_bench_doc(True), tmp_path)
    assert [p.name for p in paths] == ["bench.json", "bench.md", "bench.png"]
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths[1].read_text()
    assert bench_report.SHARED_LABEL in md
    assert "Model projection" in md
    assert json.loads(paths[0].read_text())["projection"][0]["tokens"] == 1


def test_report_command_rerenders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "t.json"
    src.write_text(json.dumps(_test_data()))
    assert main(["report", "--test", str(src), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "test-ab.md").is_file()
    assert "wrote" in capsys.readouterr().out
    assert main(["report", "--out", str(tmp_path / "x")]) == UsageError.exit_code


def test_a_report_that_is_not_one_is_refused_naming_the_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpu report`` reads test-ab.json and bench.json through their typed readers: a
    malformed case or bench line names the file and the dotted key, not a KeyError."""
    doc = _test_data()
    del doc["results"]["unpatched"][1]["status"]
    src = tmp_path / "t.json"
    src.write_text(json.dumps(doc))
    assert main(["report", "--test", str(src), "--out", str(tmp_path / "out")]) == \
        ConfigError.exit_code
    assert f"{src}: results.unpatched[1].status: is missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    bench = json.loads(json.dumps(_bench_doc(False)))
    del bench["records"][3]["hidden"]
    src.write_text(json.dumps(bench))
    with pytest.raises(ConfigError) as err:
        bench_report.write_bench_report(json.loads(src.read_text()), tmp_path / "b", where=str(src))
    assert err.value.where == f"{src}: records[3].hidden"


def test_gpu_slug() -> None:
    assert core_report.gpu_slug("NVIDIA H200", 1) == "h200-1x"
    assert core_report.gpu_slug("NVIDIA RTX PRO 6000 Blackwell Server Edition", 8) == \
        "rtx-pro-6000-blackwell-server-edition-8x"


def test_test_refuses_multicast_backends_before_touching_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["test", "--quick", "--backend", "auto", "--work-dir", str(tmp_path)])
    assert rc == 2
    assert "multicast" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.usefixtures("gpu_here")
def test_test_command_whose_module_build_fails_reports_every_case_as_a_build_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole `test` path on a CPU machine past the preflight: the module step fails
    (no CUDA here), nothing hangs, the
    report says why, and the exit code says the build is not to be trusted."""
    out = tmp_path / "report"
    rc = main(["test", "--quick", "--world-sizes", "2", "--max-cases", "3",
               "--work-dir", str(tmp_path / "work"), "--out", str(out),
               "--compile-timeout", "120"])
    assert rc == 13
    doc = json.loads((out / "test-ab.json").read_text())
    recs = doc["results"]["installed"]
    assert len(recs) == 3
    assert all(r["status"] == "fail" and r["failure"] == "build" for r in recs)
    assert "build FAILED" in (out / "test-ab.md").read_text()
    assert (out / "logs").is_dir()
    assert "unfinished: 3 planned case runs never ran" in capsys.readouterr().err

