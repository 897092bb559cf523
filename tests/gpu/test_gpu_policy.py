"""The all-reduce policy made from bench records, and the bench run that writes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sm120fork.errors import ConfigError
from sm120fork.gpu import policy
from sm120fork.gpu.core.cases import BenchPlan


def _point(method: str, tokens: int, hidden: int, us: float | None,
           status: str = "timed") -> dict[str, Any]:
    rec: dict[str, Any] = {"kind": "point", "method": method, "tokens": tokens,
                           "hidden": hidden, "status": status}
    if us is not None:
        rec.update(median_us=us, rank_medians_us=[us * 0.9, us], rank_p90_us=[us, us])
    return rec


def _records() -> list[dict[str, Any]]:
    """fused_auto wins 1-16 at both hidden sizes; at 64 it wins at 4096 only; pcie_ipc
    wins from 64 on; the vLLM custom AR is fastest but wrong."""
    recs = []
    for hidden in (4096, 7168):
        for tokens, fused, pcie_us, nccl in ((1, 5, 8, 30), (16, 6, 9, 31),
                                             (64, 12, 11, 40), (512, 40, 20, 60)):
            pcie = 13 if tokens == 64 and hidden == 4096 else pcie_us
            recs += [_point("fused_auto", tokens, hidden, fused),
                     _point("fused_oneshot", tokens, hidden, fused - 1),
                     _point("pcie_ipc_rmsnorm", tokens, hidden, pcie),
                     _point("nccl_rmsnorm", tokens, hidden, nccl),
                     _point("custom_vllm_rmsnorm", tokens, hidden, None, "failed_check")]
    return recs


def _spans(entry: dict[str, Any]) -> list[tuple[int, int, str, list[str]]]:
    return [(r["min_tokens"], r["max_tokens"], r["method"], r["fallback"])
            for r in entry["ranges"]]


def test_every_range_names_the_fastest_method_sglang_can_run_and_the_next_ones() -> None:
    doc = policy.derive({2: _records()}, made={"gpu": "X"}, for_use=True)
    entry = doc["tp"]["2"]
    # fused_oneshot is faster still but SGLang cannot select it: never named.  At 64
    # tokens no method wins at both hidden sizes: pcie_ipc's worst ratio (13/12) beats
    # fused_auto's (12/11).
    assert _spans(entry) == [
        (1, 16, "fused_auto", ["pcie_ipc_rmsnorm", "nccl_rmsnorm"]),
        (17, 512, "pcie_ipc_rmsnorm", ["fused_auto", "nccl_rmsnorm"])]
    assert entry["measured_tokens"] == [1, 16, 64, 512]
    assert "custom_vllm_rmsnorm" in entry["excluded"]
    assert doc["version"] == 2
    assert policy.validate(json.loads(json.dumps(doc)), "p.json") == doc


def test_a_method_beaten_at_one_token_only_loses_that_range() -> None:
    recs = [_point("fused_auto", 1, 7168, 9), _point("nccl_rmsnorm", 1, 7168, 8),
            _point("fused_auto", 16, 7168, 5), _point("nccl_rmsnorm", 16, 7168, 8)]
    assert _spans(policy.derive({4: recs}, made={}, for_use=True)["tp"]["4"]) == [
        (1, 1, "nccl_rmsnorm", ["fused_auto"]), (2, 16, "fused_auto", ["nccl_rmsnorm"])]


def test_the_slowest_rank_decides() -> None:
    """Rank medians [0.9x, 1x]: the max is compared, not the mean."""
    recs = [_point("fused_auto", 1, 7168, 10), _point("nccl_rmsnorm", 1, 7168, 9.5)]
    recs[1]["rank_medians_us"] = [1.0, 9.5]
    assert policy.derive({2: recs}, made={}, for_use=True)["tp"]["2"]["ranges"][0][
        "method"] == "nccl_rmsnorm"


def test_a_method_that_could_not_run_is_named_with_its_reason() -> None:
    recs = [*_records(), {"kind": "method", "method": "b12x_fused", "status": "not_runnable",
                          "reason": "b12x runs on SM12x only; this GPU is sm_90"}]
    entry = policy.derive({2: recs}, made={}, for_use=True)["tp"]["2"]
    assert entry["not_measured"] == {
        "b12x_fused": "b12x runs on SM12x only; this GPU is sm_90"}


V1 = {"format": "sm120fork-allreduce-policy", "version": 1, "for_use": True,
      "made": {"gpu": "RTX PRO 6000"},
      "tp": {"2": {"fused_max_tokens": 64, "ranges": [
          {"min_tokens": 1, "max_tokens": 64, "method": "fused_oneshot", "fused": True},
          {"min_tokens": 65, "max_tokens": 512, "method": "pcie_ipc_rmsnorm",
           "fused": False}]},
             "4": {"fused_max_tokens": 0, "ranges": []}}}


def test_a_version_1_policy_is_refused_naming_the_file_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        policy.validate(json.loads(json.dumps(V1)), "old.json")
    assert err.value.where == "old.json: version"
    assert err.value.message == ("old.json: version: policy version 1: this reader takes "
                                 "versions 2 (re-make it with this toolkit: nox -s tune -- "
                                 "--stack NAME)")


@pytest.mark.parametrize(("edit", "where"), [
    ({"version": 3}, "policy.json: version"),
    ({"format": "other"}, "policy.json: format"),
    ({"for_use": "yes"}, "policy.json: for_use"),
    ({"tp": {"1": {"ranges": []}}}, "policy.json: tp.1"),
    ({"tp": {"2": {"ranges": [{"min_tokens": 2, "max_tokens": 4, "method": "x"}]}}},
     "policy.json: tp.2.ranges[0].min_tokens"),
    ({"tp": {"2": {"ranges": [{"min_tokens": 1, "max_tokens": 0, "method": "x"}]}}},
     "policy.json: tp.2.ranges[0].max_tokens"),
    ({"tp": {"2": {"ranges": [{"min_tokens": 1, "max_tokens": 4, "method": "x",
                               "fallback": "nccl_rmsnorm"}]}}},
     "policy.json: tp.2.ranges[0].fallback"),
    ({"version": 1, "tp": {"2": {"fused_max_tokens": -1, "ranges": []}}},
     "policy.json: version"),
])
def test_a_bad_policy_names_the_file_and_key(edit: dict[str, Any], where: str) -> None:
    doc = {**policy.derive({2: _records()}, made={}, for_use=True), **edit}
    with pytest.raises(ConfigError) as err:
        policy.validate(doc, "policy.json")
    assert err.value.where == where


def test_describe_says_when_a_policy_is_not_for_use() -> None:
    doc = policy.derive({2: _records()}, made={"note": "made on a shared GPU"},
                        for_use=False)
    lines = policy.describe(doc)
    assert lines[0].startswith("marked NOT FOR USE (made on a shared GPU)")
    assert lines[1] == ("TP2: 1-16: fused_auto (then pcie_ipc_rmsnorm, nccl_rmsnorm), "
                        "17-512: pcie_ipc_rmsnorm (then fused_auto, nccl_rmsnorm); above: "
                        "SGLang's own dispatch")


@pytest.mark.usefixtures("gpu_here")
def test_bench_on_a_shared_gpu_writes_reports_and_a_policy_not_for_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The bench's orchestration with the rank groups faked: one group per environment,
    the tuned NCCL row reported as not runnable without starting ranks."""
    from sm120fork.gpu.bench import run as bench_run
    from sm120fork.gpu.cli import main
    from sm120fork.gpu.core import variants
    from sm120fork.util import proc

    monkeypatch.setattr(variants, "compile_variants", lambda installed, *_a, **_k: {
        v.name: variants.ModuleBuild(ok=True, env={"gpu_count": 1, "gpus": ["Fake GPU"]},
                                     module_failures={"pcie_ipc": "absent"})
        for v in installed})
    groups: list[dict[str, Any]] = []

    def run_group(plan: BenchPlan, _variant: Any, _run_dir: Path, **kw: Any) -> Any:
        groups.append({"methods": kw["methods"], "env": kw["extra_env"],
                       "module_failures": kw["module_failures"]})
        recs = [r for r in _records() if r["method"] in kw["methods"]
                and r["tokens"] in plan.tokens]
        return recs, {"shared": True}, proc.GroupOutcome(ok=True)

    monkeypatch.setattr(bench_run, "run_group", run_group)
    out = tmp_path / "out"
    rc = main(["bench", "--world-sizes", "2", "--tokens", "1,16,64", "--hidden", "4096,7168",
               "--work-dir", str(tmp_path / "work"), "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    assert len(groups) == 1  # the tuned NCCL group never started on a shared GPU
    assert "nccl_tuned_rmsnorm" not in groups[0]["methods"]
    assert groups[0]["module_failures"] == {"pcie_ipc": "absent"}
    doc = json.loads((out / "bench.json").read_text())
    tuned = [r for r in doc["records"] if r["method"] == "nccl_tuned_rmsnorm"]
    assert tuned[0]["status"] == "not_runnable"
    assert "share a GPU" in tuned[0]["reason"]
    written = policy.load(out / "policy.json")
    assert written["for_use"] is False
    assert "not for use" in written["made"]["note"]
    md = (out / "bench.md").read_text()
    assert "| custom_vllm_rmsnorm |" in md
    assert "failed check" in md
    assert "policy: marked NOT FOR USE" in capsys.readouterr().out


@pytest.mark.usefixtures("gpu_here")
def test_a_method_that_kills_the_ranks_is_recorded_and_the_rest_run_in_a_new_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sm120fork.gpu.bench import run as bench_run
    from sm120fork.gpu.cli import main
    from sm120fork.gpu.core import variants
    from sm120fork.util import proc

    monkeypatch.setattr(variants, "compile_variants", lambda installed, *_a, **_k: {
        v.name: variants.ModuleBuild(ok=True, env={"gpu_count": 2, "gpus": ["Fake GPU"]})
        for v in installed})
    asked: list[list[str]] = []

    def run_group(plan: BenchPlan, _variant: Any, _run_dir: Path, **kw: Any) -> Any:
        names = list(kw["methods"])
        asked.append(names)
        recs: list[dict[str, Any]] = []
        for name in names:
            recs.append({"kind": "method", "method": name, "status": "starting"})
            if name == "fused_twoshot":  # an illegal address: the ranks exit
                return recs, {}, proc.GroupOutcome(ok=False, kind="crash",
                                                        failure="rank 1 exited with code 3")
            recs.append(_point(name, 1, 7168, 5.0))
        return recs, {}, proc.GroupOutcome(ok=True)

    monkeypatch.setattr(bench_run, "run_group", run_group)
    out = tmp_path / "out"
    rc = main(["bench", "--world-sizes", "2", "--method", "nccl_rmsnorm", "--method",
               "fused_twoshot", "--method", "fused_auto", "--work-dir", str(tmp_path / "w"),
               "--out", str(out)])
    assert asked == [["nccl_rmsnorm", "fused_twoshot", "fused_auto"], ["fused_auto"]]
    assert rc == 13  # a method died: the run is not a pass
    doc = json.loads((out / "bench.json").read_text())
    died = [r for r in doc["records"] if r.get("status") == "error"]
    assert died[0]["method"] == "fused_twoshot"
    assert "ranks died" in died[0]["reason"]
    timed = {r["method"] for r in doc["records"] if r.get("status") == "timed"}
    assert timed == {"nccl_rmsnorm", "fused_auto"}
    assert policy.load(out / "policy.json")["for_use"] is False  # partial: not for use


def test_the_doctor_reads_where_sglang_looks(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable names the file; else the default place under the home folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".config" / "sm120fork" / "allreduce-policy.json"
    assert policy.locate({}) == default
    found = policy.read_for_doctor({})
    assert (found["path"], found["named_by"], found["found"]) == (str(default), "default",
                                                                  False)
    default.parent.mkdir(parents=True)
    default.write_text("{not json")
    assert policy.read_for_doctor({})["error"].startswith("cannot read it: ")
    doc = policy.derive({2: _records()}, made={}, for_use=True)
    policy.write(doc, tmp_path)
    named = policy.read_for_doctor({policy.ENV_VAR: str(tmp_path / "policy.json")})
    assert named["named_by"] == policy.ENV_VAR
    assert named["document"] == json.loads(json.dumps(doc))
    assert named["error"] is None


ROOT = Path(__file__).resolve().parents[2]


def _added_code(patch: Path) -> str:
    return "\n".join(line[1:] for line in patch.read_text().splitlines()
                     if line.startswith("+") and not line.startswith("+++"))


def test_sglang_looks_where_the_doctor_looks() -> None:
    """Every patch that reads the policy (S1 for the default stack, G7 for 0.5.23 and so
    the plugin's hooks) reads the file the variable names, else the default place: the
    two values the doctor's :func:`policy.locate` uses, and no other."""
    import re

    readers: dict[str, tuple[str, str]] = {}
    for patch in sorted(ROOT.glob("patches/*/sglang/*.patch")):
        code = _added_code(patch)
        reads = re.findall(r"os\.environ\.get\(\s*([\w\"-]+)\s*\)\s*or\s*([\w\"~/.-]+)", code)
        consts = dict(re.findall(r'^\s*(\w+)\s*=\s*("[^"]*")\s*$', code, re.MULTILINE))
        for env_name, default_name in reads:
            env, default = consts.get(env_name, env_name), consts.get(default_name, default_name)
            if "POLICY" in env or "policy" in default:
                readers[patch.name.split("-")[1]] = (env.strip('"'), default.strip('"'))
        named = set(re.findall(r'"(SGLANG_SM120_\w*POLICY\w*)"', code))
        places = set(re.findall(r'"(~/[^"]*policy[^"]*)"', code))
        assert named <= {policy.ENV_VAR}, (patch.name, named)
        assert places <= {policy.DEFAULT_PATH}, (patch.name, places)
    assert set(readers) >= {"S1"}
    assert set(readers.values()) == {(policy.ENV_VAR, policy.DEFAULT_PATH)}
    # 0.5.23's G7 (and so the plugin) reads through the module it adds, the toolkit's own
    # reader and its locate() (tests/plugin/test_bundle.py: byte for byte)
    (g7,) = ROOT.glob("patches/sglang-0.5.23/sglang/0007-G7-*.patch")
    assert "from sglang.srt.layers import sm120fork_allreduce" in _added_code(g7)
    assert "return Path(os.path.expanduser(env.get(ENV_VAR) or DEFAULT_PATH))" in \
        _added_code(g7)


def test_the_docs_page_documents_every_key_a_policy_has() -> None:
    """The format table in docs/policy.md names each key the bench writes (one derived
    here from records with every kind of entry), so the page cannot drift."""
    import re

    section = (ROOT / "docs" / "policy.md").read_text().split(
        f"format `sm120fork-allreduce-policy` version {policy.VERSION}", 1)[1].split(
        "\n\n", 2)[1]
    documented = set(re.findall(r"`([a-z0-9_.N]+)`", section))
    recs = [*_records(), {"kind": "method", "method": "b12x_fused", "status": "not_runnable",
                          "reason": "SM12x only"}]
    doc = policy.derive({2: recs}, made={"created": "x", "gpu": "x", "gpu_count": 2,
                                         "shared_gpu": False, "stack": "x",
                                         "flashinfer": "x", "wheel_sha256": "x",
                                         "dtype": "bf16", "hidden": [], "note": None},
                        for_use=True)
    keys = set(doc) | set(doc["made"])
    for entry in doc["tp"].values():
        keys |= {f"tp.N.{k}" for k in entry}
        for rng in entry["ranges"]:
            keys |= set(rng)
    assert keys - documented == set()
