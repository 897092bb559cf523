"""``doctor``: probing stubbed or faked where it needs a GPU, judging always real.

The rules are pure functions of a facts dict, so most tests build the facts of a box we
do not have and judge them; the committed scenarios (reports/doctor/scenarios/) are
judged the same way.  The probes are tested against stand-ins: a fake FlashInfer package
laid out like the real one (its marker rule is the one patch 0002 adds, taken from the
patch file), the real IPC child over a file-backed driver, and a host-memory libcuda.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sm120fork.doctor import cli, ipc, probe, rules
from sm120fork.doctor.cuda import COPY_KERNEL_PTX, CudaError, Driver
from sm120fork.doctor.facts import SCHEMA, Modules
from sm120fork.errors import ConfigError, DoctorError, UsageError
from sm120fork.gpu import decision
from sm120fork.gpu import policy as allreduce_policy
from sm120fork.util import proc, wire

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parents[1]
SCENARIOS = ROOT / "reports" / "doctor" / "scenarios"
SM120 = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
#: The default stack's patch that adds FlashInfer's prebuilt-module rule (jit/provenance.py).
PROVENANCE_PATCH = next(
    p for p in sorted((ROOT / "patches" / "sglang-0.5.10" / "flashinfer").glob("*.patch"))
    if "+++ b/flashinfer/jit/provenance.py\n" in p.read_text())


# --- facts of boxes we do not have --------------------------------------------------------

def link(w: int, o: int, *, ok: bool = True, write: float = 52.0, read: float = 52.0,
         error: str | None = None) -> Any:
    steps = {"open": "ok", "write": "ok" if ok else "1024 of 1024 words wrong", "read": "ok"}
    result = ipc.LinkResult(writer=w, owner=o, writer_gpu=w, owner_gpu=o,
                            sharing={"vmm": dict(steps), "ipc": dict(steps)},
                            write_gbps=write, read_gbps=read, error=error)
    return result.to_json()


def flashinfer(version: str = "0.7.2", cuda: str = "13.0", source: str = "nvcc",
               floor: str = "12.8", **comm: Any) -> dict[str, Any]:
    archs: dict[str, Any] = {"12.0": {"arch": "120f", "floor": floor}}
    if cuda < floor:
        archs["12.0"] = {"error": f"SM 12.x requires CUDA >= {floor}", "floor": floor}
    base = "~/.cache/flashinfer/" + version
    return {"version": version, "aot_dir": "<site-packages>/flashinfer/data/aot",
            "jit_cache_package": False, "workspace_dir": f"{base}/120f",
            "jit_dir": f"{base}/120f/cached_ops", "cache_root": "~/.cache/flashinfer",
            "other_caches": comm.pop("other_caches", []), "cuda_version": cuda,
            "cuda_from": source, "nvcc": "/usr/local/cuda/bin/nvcc" if source == "nvcc" else None,
            "torch_cuda": cuda, "archs": archs, "disable_jit": False,
            "comm": comm or {"aot_path": "<site-packages>/flashinfer/data/aot/trtllm_comm/"
                                         "trtllm_comm.so", "aot_exists": False,
                             "jit_path": f"{base}/120f/cached_ops/trtllm_comm/trtllm_comm.so",
                             "jit_exists": False, "is_aot": False, "provenance": None}}


def box(n: int = 2, *, capability: str = "12.0", numa: Sequence[int] | None = None,
        p2p: Any = True, links: list[dict[str, Any]] | None = None,
        packages: dict[str, str | None] | None = None, **extra: Any) -> Any:
    """Facts of an n-GPU SM120 box with stock SGLang 0.5.23 + our plugin, FlashInfer 0.7.2."""
    numa = list(numa or [0] * n)
    matrix = [[a == b or (p2p(a, b) if callable(p2p) else p2p) for b in range(n)]
              for a in range(n)]
    if links is None and n > 1:
        links = [link(w, o) if matrix[w][o] else
                 link(w, o, error="GPU cannot map the peer: cuMemSetAccess failed")
                 for a in range(n) for b in range(a + 1, n) for w, o in ((a, b), (b, a))]
    pkgs = {"sglang": "0.5.23", "flashinfer-python": "0.7.2", "flashinfer-cubin": None,
            "flashinfer-jit-cache": None, "torch": "2.14.1",
            probe.PLUGIN_DISTRIBUTION: "0.5.23+sm120.1", "sm120fork": None}
    pkgs.update(packages or {})
    sizes = probe.tp_sizes(n)
    facts: dict[str, Any] = {
        "schema": SCHEMA, "made_by": {"doctor": "test", "python": "3.12",
                                            "machine": "x86_64"},
        "environ": {}, "skipped": {},
        "gpus": {"driver": "13.0", "error": None, "p2p": matrix, "devices": [
            {"index": i, "name": SM120, "capability": capability, "multicast": False,
             "pci_bus_id": f"0000:{0x10 + i:02X}:00.0", "numa_node": numa[i]}
            for i in range(n)]},
        "topology": None, "torch": {"version": "2.14.1", "cuda": "13.0"},
        "nvcc": {"path": "/usr/local/cuda/bin/nvcc", "version": "13.0"},
        "packages": pkgs, "requires": {"sglang": ["flashinfer_python[cu13]==0.7.2"]},
        "plugin": {"hooks": [{"hook": "G1 sglang.srt.layers.flashinfer_comm_fusion."
                                      "_resolve_backend", "state": "applied", "why": ""}],
                   "stack": "sglang-0.5.23"},
        "peers": ({"processes_on_one_gpu": n == 1, "links": links or [link(0, 1), link(1, 0)]}),
        "flashinfer": flashinfer(),
        "decisions": {"model": "Qwen3MoeForCausalLM", "source": "arg_groups",
                      "plugins_loaded": True, "decisions": [
                          {"tp": t, "fusion": t == 2, "backend": "trtllm" if t == 2 else None,
                           "line": "Auto-enabling ... on SM12x: TP2" if t == 2 else
                           f"not auto-enabled: only TP2 (TP{t})"} for t in sizes]}
        if sizes else None}
    facts["policy"] = {"path": "~/.config/sm120fork/allreduce-policy.json",
                       "named_by": "default", "found": False, "document": None, "error": None}
    facts["modules"] = {"asked": decision.needed_names(),
                        "present": ["flashinfer.comm:PcieIpcAllReduceWorkspace",
                                    "flashinfer.comm:trtllm_allreduce_fusion"]}
    if n == 1:
        facts["peers"]["links"] = [link(0, 1), link(1, 0)]
        for x in facts["peers"]["links"]:
            x["writer_gpu"] = x["owner_gpu"] = 0
        facts["skipped"]["decisions"] = "1 GPU: no --tp above 1 fits on this box"
    facts.update(extra)
    return facts


def run(facts: Any, tmp_path: Path, *args: str,
        capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    code = cli.main(["--facts", str(path), *args])
    return code, capsys.readouterr().out


def blockers(facts: Any, **kw: Any) -> list[str]:
    return rules.judge(facts, **kw).blockers


# --- item 6: probing apart from judging, record and re-judge --------------------------------

def stub_probes(facts: dict[str, Any]) -> probe.Probes:
    """Probes that answer with these facts (what a box would have said)."""
    pkgs = facts["packages"]

    def peers(devices: Sequence[int]) -> list[ipc.LinkResult]:
        return [ipc.LinkResult(**{k: v for k, v in x.items()
                                  if k not in ("ok", "detail")}) for x in facts["peers"]["links"]]

    return probe.Probes(
        gpus=lambda: facts["gpus"], torch=lambda: facts["torch"], peers=peers,
        installed=pkgs.get, requirements=lambda d: facts["requires"].get(d, []),
        plugin=lambda: facts["plugin"], nvcc=lambda: facts["nvcc"],
        plugin_framework=lambda: facts.get("sglang_plugin_framework"),
        flashinfer=lambda caps: facts["flashinfer"],
        decisions=lambda sizes: facts["decisions"], topology=lambda: None,
        policy=lambda environ: facts["policy"], modules=lambda: facts["modules"],
        environ=facts["environ"])


def test_record_then_judge_offline_gives_the_same_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = box(4, packages={"sm120fork": None})
    record = tmp_path / "box.json"
    assert cli.main(["--record", str(record), "--json"], stub_probes(facts)) == 0
    live = json.loads(capsys.readouterr().out)
    recorded = json.loads(record.read_text())
    assert recorded["schema"] == SCHEMA
    assert recorded["gpus"] == facts["gpus"]
    assert recorded["peers"]["links"] == \
        facts["peers"]["links"]
    assert cli.main(["--facts", str(record), "--json"]) == 0
    judged = json.loads(capsys.readouterr().out)
    assert judged.pop("python") == {"path": sys.executable, "why": f"the facts in {record}"}
    live.pop("python")
    assert judged == live


def test_a_record_carries_no_home_or_site_packages_path(tmp_path: Path) -> None:
    facts = box(2)
    facts["flashinfer"]["aot_dir"] = f"{sys.path[-1]}/flashinfer/data/aot"
    facts["flashinfer"]["jit_dir"] = f"{Path.home()}/.cache/flashinfer/0.7.2/120f/cached_ops"
    out: Any = probe.portable(facts)
    assert out["flashinfer"]["jit_dir"] == "~/.cache/flashinfer/0.7.2/120f/cached_ops"
    if sys.path[-1].endswith(("site-packages", "dist-packages")):
        assert out["flashinfer"]["aot_dir"] == "<site-packages>/flashinfer/data/aot"


def test_facts_of_another_schema_are_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema": "something-else"}))
    assert cli.main(["--facts", str(path)]) == 16
    assert "schema 'something-else'" in capsys.readouterr().err


def _capability_as_int(facts: Any) -> None:
    facts["gpus"]["devices"][0]["capability"] = 120


def _links_as_object(facts: Any) -> None:
    facts["peers"]["links"] = {"0-1": True}


def _write_as_text(facts: Any) -> None:
    facts["peers"]["links"][1]["write_gbps"] = "fast"


def _floor_as_number(facts: Any) -> None:
    facts["flashinfer"]["archs"]["12.0"]["floor"] = 12.8


@pytest.mark.parametrize(("spoil", "key", "said"), [
    (_capability_as_int, "gpus.devices[0].capability", "is an int, not a string"),
    (_links_as_object, "peers.links", "is an object, not a list"),
    (_write_as_text, "peers.links[1].write_gbps", "is a string, not a number or null"),
    (_floor_as_number, "flashinfer.archs.12.0.floor", "is a number, not a string or null"),
])
def test_a_record_with_a_key_of_the_wrong_type_is_refused_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: Callable[[Any], None],
        key: str, said: str) -> None:
    """Not a KeyError/TypeError deep in a rule (an internal error, exit 70): the one
    reader (doctor/facts.py) names the file and the dotted key, a ConfigError (exit 2)."""
    facts = box(2)
    spoil(facts)
    path = tmp_path / "spoiled.json"
    path.write_text(json.dumps(facts))
    assert cli.main(["--facts", str(path)]) == ConfigError("").exit_code
    assert f"{path}: {key}: {said}" in capsys.readouterr().err


def test_text_and_json_are_the_same_lines(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    facts = box(2, environ={"SM120FORK_PLUGIN": "0"})
    code, text = run(facts, tmp_path, capsys=capsys)
    assert cli.main(["--facts", str(tmp_path / "facts.json"), "--json"]) == code
    report = json.loads(capsys.readouterr().out)
    shown = [line[2:] for line in text.splitlines() if line.startswith("  ")
             and not line.startswith("  BLOCKER: ")]
    assert shown == [x for lines in report["text"].values() for x in lines]


# --- item 1: where modules really load from -----------------------------------------------

def test_a_stale_stock_jit_cache_does_not_hide_the_missing_nvcc() -> None:
    fi = flashinfer("0.6.7.post3+sm120.1", cuda="13.0", source="torch", floor="12.9",
                    other_caches=["~/.cache/flashinfer/0.6.7.post3/120f/cached_ops/"
                                  "trtllm_comm/trtllm_comm.so"])
    facts = box(2, nvcc=None, flashinfer=fi, packages={
        "sglang": "0.5.10.post1+sm120.1", "flashinfer-python": "0.6.7.post3+sm120.1",
        probe.PLUGIN_DISTRIBUTION: None})
    report = rules.judge(facts)
    assert any("no loadable prebuilt trtllm_comm and no nvcc" in b for b in report.blockers)
    assert ("comm module", "ignored: ~/.cache/flashinfer/0.6.7.post3/120f/cached_ops/"
            "trtllm_comm/trtllm_comm.so (JIT cache of flashinfer 0.6.7.post3; this one looks "
            "only in ~/.cache/flashinfer/0.6.7.post3+sm120.1/120f/cached_ops)") in report.lines


def test_a_marker_whose_digest_does_not_match_is_not_loaded() -> None:
    aot = "<site-packages>/flashinfer_jit_cache/jit_cache/trtllm_comm/trtllm_comm.so"
    fi = flashinfer("0.6.7.post3+sm120.1", source="torch", floor="12.9",
                    aot_path=aot, aot_exists=True, jit_path="x", jit_exists=False,
                    is_aot=False, provenance={
                        "marker": aot + ".sources", "recorded": "sha256:" + "0" * 64,
                        "sources": "sha256:" + "a" * 64,
                        "mismatch": "trtllm_comm.so.sources records sha256:0000..., this "
                                    "build's sources are sha256:aaaa..."})
    report = rules.judge(box(2, nvcc=None, flashinfer=fi))
    assert any(t.startswith(f"trtllm_comm: does NOT load the prebuilt {aot}: trtllm_comm.so."
                            "sources records") for _, t in report.lines)
    assert any("no loadable prebuilt trtllm_comm and no nvcc" in b for b in report.blockers)
    fi["comm"]["is_aot"] = True
    fi["comm"]["provenance"]["mismatch"] = None
    assert rules.judge(box(2, nvcc=None, flashinfer=fi)).blockers == []


def fake_flashinfer(root: Path, version: str = "0.6.7.post3+sm120.1",
                    floor: str = "12.9", verdicts: bool = False) -> Path:
    """A package laid out like FlashInfer's (version, jit.env, compilation_context,
    jit.cpp_ext, jit.core, jit.comm) with the real jit/provenance.py of patch 0002."""
    pkg = root / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "data" / "csrc").mkdir(parents=True)
    (pkg / "data" / "include").mkdir(parents=True)
    (pkg / "data" / "csrc" / "trtllm_allreduce.cu").write_text("// ours\n")
    (pkg / "data" / "include" / "x.cuh").write_text("// ours\n")
    files = {
        "__init__.py": "from .version import __version__\n",
        "version.py": f"__version__ = {version!r}\n",
        "compilation_context.py": f'''
import os
class CompilationContext:
    @staticmethod
    def _normalize_cuda_arch(major, minor):
        if major == 12:
            from flashinfer.jit.cpp_ext import is_cuda_version_at_least
            if is_cuda_version_at_least("{floor}"):
                return (major, "0f")
            raise RuntimeError("SM 12.x requires CUDA >= {floor}")
        return (major, str(minor) + "a")
    def __init__(self):
        self.TARGET_CUDA_ARCHS = set()
        for arch in os.environ.get("FAKE_GPUS", "").split():
            try:
                self.TARGET_CUDA_ARCHS.add(self._normalize_cuda_arch(*map(int, arch.split("."))))
            except Exception:
                pass
    def get_nvcc_flags_list(self, supported_major_versions=None):
        if not [a for a in self.TARGET_CUDA_ARCHS if a[0] in supported_major_versions]:
            raise RuntimeError("No supported CUDA architectures found for major versions "
                               f"{{supported_major_versions}}.")
        return []
''',
        "jit/__init__.py": "",
        "jit/cpp_ext.py": '''
import os
from packaging.version import Version
def get_cuda_path():
    return os.environ.get("CUDA_HOME", "/nonexistent-cuda")
def get_cuda_version():
    return Version(os.environ["FAKE_CUDA"])
def is_cuda_version_at_least(v):
    return get_cuda_version() >= Version(v)
''',
        "jit/env.py": '''
import os, pathlib
from ..compilation_context import CompilationContext
from ..version import __version__ as flashinfer_version
def has_flashinfer_jit_cache():
    return False
FLASHINFER_BASE_DIR = pathlib.Path(os.getenv("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home()))
FLASHINFER_CACHE_DIR = FLASHINFER_BASE_DIR / ".cache" / "flashinfer"
_package_root = pathlib.Path(__file__).resolve().parents[1]
FLASHINFER_AOT_DIR = _package_root / "data" / "aot"
_arch = "_".join(f"{a}{b}" for a, b in sorted(CompilationContext().TARGET_CUDA_ARCHS))
FLASHINFER_WORKSPACE_DIR = FLASHINFER_CACHE_DIR / flashinfer_version / _arch
FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / "cached_ops"
FLASHINFER_CSRC_DIR = _package_root / "data" / "csrc"
FLASHINFER_INCLUDE_DIR = _package_root / "data" / "include"
''',
        "jit/core.py": '''
from ..compilation_context import CompilationContext
from . import env as jit_env
from . import provenance
current_compilation_context = CompilationContext()
class JitSpec:
    def __init__(self, name):
        self.name = name
    @property
    def aot_path(self):
        return jit_env.FLASHINFER_AOT_DIR / self.name / f"{self.name}.so"
    @property
    def jit_library_path(self):
        return jit_env.FLASHINFER_JIT_DIR / self.name / f"{self.name}.so"
    @property
    def is_aot(self):
        return self.aot_path.exists() and provenance.prebuilt_mismatch(
            self.aot_path, jit_env.FLASHINFER_CSRC_DIR, jit_env.FLASHINFER_INCLUDE_DIR) is None
''',
        "jit/comm.py": '''
from .core import JitSpec, current_compilation_context
def gen_trtllm_comm_module():
    current_compilation_context.get_nvcc_flags_list(supported_major_versions=[9, 10, 12])
    return JitSpec("trtllm_comm")
''',
    }
    if verdicts:   # a build that searches provider folders too (JitSpec.prebuilt_verdicts)
        files["jit/env.py"] += (
            "def prebuilt_provider_dirs():\n"
            "    return ((\"sm120fork\", _package_root.parent / \"provider\" / \"jit_cache\"),)\n")
        files["jit/core.py"] += '''
def _verdicts(self):
    out = []
    for folder in [d for _, d in jit_env.prebuilt_provider_dirs()] + [jit_env.FLASHINFER_AOT_DIR]:
        so = folder / self.name / f"{self.name}.so"
        if so.exists():
            why = provenance.prebuilt_mismatch(so, jit_env.FLASHINFER_CSRC_DIR,
                                               jit_env.FLASHINFER_INCLUDE_DIR)
            out.append((so, why is None, why or "built from this build's sources"))
    return out
JitSpec.prebuilt_verdicts = _verdicts
JitSpec.is_aot = property(lambda self: any(load for _, load, _ in self.prebuilt_verdicts()))
'''
    for name, text in files.items():
        (pkg / name).write_text(text)
    hunk = PROVENANCE_PATCH.read_text().partition("+++ b/flashinfer/jit/provenance.py\n")[2]
    body = [line[1:] for line in hunk.splitlines()[1:] if line.startswith("+")]
    (pkg / "jit" / "provenance.py").write_text("\n".join(body) + "\n")
    return pkg


def ask_flashinfer(site: Path, workspace: Path, **env: str) -> dict[str, Any]:
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *sys.path]),
                   FLASHINFER_WORKSPACE_BASE=str(workspace), **env)
    done = subprocess.run([sys.executable, "-m", "sm120fork.doctor.flashinfer_probe", "12.0"],
                          env=environ, capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, Any] = wire.last(done.stdout, "FLASHINFER")
    return result


def test_the_probe_asks_flashinfer_where_it_loads_from(tmp_path: Path) -> None:
    pkg = fake_flashinfer(tmp_path / "site")
    stale = (tmp_path / "ws" / ".cache" / "flashinfer" / "0.6.7.post3" / "120f" /
             "cached_ops" / "trtllm_comm")
    stale.mkdir(parents=True)
    (stale / "trtllm_comm.so").write_bytes(b"\x7fELF stock")
    aot = pkg / "data" / "aot" / "trtllm_comm"
    aot.mkdir(parents=True)
    (aot / "trtllm_comm.so").write_bytes(b"\x7fELF")
    (aot / "trtllm_comm.so.sources").write_text("sha256:" + "0" * 64 + "\n")
    facts = ask_flashinfer(tmp_path / "site", tmp_path / "ws", FAKE_CUDA="13.0",
                           FAKE_GPUS="12.0")
    assert facts["version"] == "0.6.7.post3+sm120.1"
    assert facts["jit_dir"].endswith("/.cache/flashinfer/0.6.7.post3+sm120.1/120f/cached_ops")
    assert facts["other_caches"] == [str(stale / "trtllm_comm.so")]
    assert facts["archs"] == {"12.0": {"arch": "120f", "floor": "12.9"}}
    assert facts["cuda_from"] == "torch"
    assert facts["nvcc"] is None
    comm = facts["comm"]
    assert comm["aot_exists"] is True
    assert comm["is_aot"] is False
    assert comm["provenance"]["mismatch"].startswith("trtllm_comm.so.sources records sha256:0")
    # the digest FlashInfer's own rule recomputes over its data/csrc + data/include
    digest = comm["provenance"]["sources"]
    (aot / "trtllm_comm.so.sources").write_text(digest + "\n")
    again = ask_flashinfer(tmp_path / "site", tmp_path / "ws", FAKE_CUDA="13.0",
                           FAKE_GPUS="12.0")["comm"]
    assert again["is_aot"] is True
    assert again["provenance"]["mismatch"] is None


def test_the_probe_reports_every_prebuilt_copy_as_flashinfer_judges_it(tmp_path: Path) -> None:
    pkg = fake_flashinfer(tmp_path / "site", verdicts=True)
    stock = pkg / "data" / "aot" / "trtllm_comm"
    stock.mkdir(parents=True)
    (stock / "trtllm_comm.so").write_bytes(b"\x7fELF stock")
    ours = tmp_path / "site" / "provider" / "jit_cache" / "trtllm_comm"
    ours.mkdir(parents=True)
    (ours / "trtllm_comm.so").write_bytes(b"\x7fELF ours")
    first = ask_flashinfer(tmp_path / "site", tmp_path / "ws", FAKE_CUDA="13.0",
                           FAKE_GPUS="12.0")
    (ours / "trtllm_comm.so.sources").write_text(first["comm"]["provenance"]["sources"])
    facts = ask_flashinfer(tmp_path / "site", tmp_path / "ws", FAKE_CUDA="13.0",
                           FAKE_GPUS="12.0")
    assert facts["prebuilt_providers"] == [["sm120fork", str(ours.parent)]]
    copies = facts["comm"]["copies"]
    assert [(Path(c["path"]), c["load"]) for c in copies] == [
        (ours / "trtllm_comm.so", True), (stock / "trtllm_comm.so", False)]
    report = rules.judge(box(2, nvcc=None, flashinfer=facts))
    assert report.blockers == []
    assert f"trtllm_comm: prebuilt {stock / 'trtllm_comm.so'}: NOT loaded: no sources digest " \
           "beside it (trtllm_comm.so.sources)" in report.text_of("comm module")
    assert report.sections["comm_module"]["loads_from"] == "prebuilt"


# --- item 2: the CUDA version that counts ---------------------------------------------------

def test_without_nvcc_torch_cuda_12_8_is_refused_by_stock_flashinfer_0_6_7(tmp_path: Path) -> None:
    facts = ask_flashinfer(fake_flashinfer(tmp_path / "site", version="0.6.7.post3").parent,
                           tmp_path / "ws", FAKE_CUDA="12.8", FAKE_GPUS="12.0")
    assert facts["archs"]["12.0"] == {"error": "SM 12.x requires CUDA >= 12.9", "floor": "12.9"}
    assert facts["comm"] == {"spec_error": "No supported CUDA architectures found for major "
                                           "versions [9, 10, 12]."}
    report = rules.judge(box(2, nvcc=None, flashinfer=facts, packages={
        "flashinfer-python": "0.6.7.post3", "sglang": "0.5.10.post1"}))
    assert any(b.startswith("comm module: flashinfer 0.6.7.post3 refuses compute "
                            "capability 12.0 with CUDA 12.8 from torch (no nvcc found): it "
                            "needs CUDA >= 12.9, and refuses before any prebuilt module")
               for b in report.blockers)


def test_the_cuda_floor_is_the_installed_flashinfers(tmp_path: Path) -> None:
    facts = ask_flashinfer(fake_flashinfer(tmp_path / "site", version="0.7.2",
                                           floor="12.8").parent,
                           tmp_path / "ws", FAKE_CUDA="12.8", FAKE_GPUS="12.0")
    assert facts["archs"]["12.0"] == {"arch": "120f", "floor": "12.8"}
    assert not [b for b in blockers(box(2, nvcc=None, flashinfer=facts)) if "CUDA >=" in b]


# --- item 3: per TP size, on the GPUs SGLang would use ----------------------------------------

def cross_socket(n: int = 8) -> Any:
    half = n // 2
    return box(n, numa=[0] * half + [1] * half, p2p=lambda a, b: (a < half) == (b < half))


def test_an_8_gpu_box_without_cross_socket_p2p_still_serves_tp2_and_tp4() -> None:
    report = rules.judge(cross_socket())
    assert report.text_of("tp") == [
        "--tp 2 ok on GPUs 0-1 (one socket: NUMA node 0)",
        "--tp 4 ok on GPUs 0-3 (one socket: NUMA node 0)",
        "--tp 8 NOT on GPUs 0-7: GPU 0 cannot access GPU 4 (no P2P)"]
    assert report.blockers == []
    assert any("--tp 8: the fused all-reduce cannot run on GPUs 0-7" in b
               for b in blockers(cross_socket(), tp=[8]))


def test_tp_uses_the_base_gpu_id_and_suggests_one_that_works() -> None:
    facts = box(4, p2p=lambda a, b: 0 not in (a, b))   # GPU 0 has no P2P at all
    report = rules.judge(facts, tp=[2])
    assert "--tp 2 NOT on GPUs 0-1: GPU 0 cannot access GPU 1 (no P2P); ok with " \
           "--base-gpu-id 1 (GPUs 1-2)" in report.text_of("tp")
    assert rules.judge(facts, base_gpu=1, tp=[2]).blockers == []


def test_no_tp_size_working_is_a_blocker() -> None:
    assert any(b.startswith("no --tp size can use the fused all-reduce here: --tp 2 on "
                            "GPUs 0-1: GPU 0 cannot access GPU 1")
               for b in blockers(box(2, p2p=False)))


# --- item 4: the peer probe ---------------------------------------------------------------

def fake_child_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    monkeypatch.setenv("FAKE_IPC_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *sys.path]))
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_each_pair_has_its_own_deadline_and_the_bad_one_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_child_env(tmp_path, monkeypatch, FAKE_IPC_HANG="2:1")
    results = ipc.probe([0, 1, 2, 3], pair_timeout=15, module="fake_ipc_child")
    by_pair = {(r.writer_gpu, r.owner_gpu): r for r in results}
    assert len(by_pair) == 12
    bad = {k for k, r in by_pair.items() if not r.ok}
    assert bad == {(1, 2), (2, 1)}, {k: r.detail for k, r in by_pair.items()}
    assert by_pair[(2, 1)].detail == ("no answer within 15s while GPU 2 mapped, wrote into "
                                      "and read from GPU 1's memory (a hang)")
    # the pairs after the hang ran with fresh processes and were measured
    assert by_pair[(2, 3)].ok
    assert by_pair[(3, 2)].write_gbps is not None


def test_dropped_peer_writes_are_found_per_sharing_and_reads_still_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_child_env(tmp_path, monkeypatch, FAKE_IPC_DROP="1")
    results = {(r.writer_gpu, r.owner_gpu): r for r in
               ipc.probe([0, 1], pair_timeout=60, module="fake_ipc_child")}
    assert results[(0, 1)].ok
    assert results[(1, 0)].sharing == {
        "vmm": {"open": "ok", "write": "1024 of 1024 words wrong", "read": "ok"},
        "ipc": {"open": "ok", "write": "1024 of 1024 words wrong", "read": "ok"}}


def test_a_probe_process_on_another_wire_version_is_named_with_its_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer probe speaks the toolkit's one wire format: a child of another version is
    named with its line (before, a line that was not this JSON read as a dead process)."""
    fake_child_env(tmp_path, monkeypatch, FAKE_IPC_OLD_WIRE="1")
    results = ipc.probe([0, 1, 2], pair_timeout=60, module="fake_ipc_child")
    by_pair = {(r.writer_gpu, r.owner_gpu): r for r in results}
    assert by_pair[(0, 2)].ok   # ordinary output was passed over
    assert by_pair[(2, 0)].ok
    detail = by_pair[(0, 1)].detail
    assert detail.startswith("not probed: setting up on GPU 1: the probe process spoke "
                             "another wire format: wire format version '0'"), detail
    assert '\'@@sm120fork/0 PROBE {"ready": {}}\'' in detail


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed grandchild may wait a moment for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def test_a_child_query_past_its_timeout_is_ended_with_what_it_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The FlashInfer and SGLang questions run through the one process runner: at the
    timeout the child goes with its process group (a bare subprocess.run left the
    grandchild running)."""
    mark = tmp_path / "grandchild"
    (tmp_path / "stuck_child.py").write_text(
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(mark)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    assert probe._child_json("stuck_child", [], "X", timeout=8) == {
        "error": "no answer within 8s"}
    assert mark.is_file(), "the child did not start its grandchild within the timeout"
    assert _gone(int(mark.read_text())), "the grandchild outlived the timed-out query"


def test_a_doctor_question_answered_on_another_wire_version_names_the_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor's questions (FlashInfer's facts, SGLang's --tp decisions) are answered
    on the one wire format; an answer of another version is named, not taken for none."""
    (tmp_path / "old_child.py").write_text(
        "print('@@sm120fork/0 DECIDE {\"2\": \"fused\"}')\n")
    (tmp_path / "new_child.py").write_text(
        "from sm120fork.util import wire\nprint('noise')\nwire.say('DECIDE', {'2': 'f'})\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    assert probe._child_json("new_child", [], "DECIDE", timeout=120) == {"2": "f"}
    error = probe._child_json("old_child", [], "DECIDE", timeout=120)["error"]
    assert error.startswith("old_child spoke another wire format: wire format version '0'")
    assert '@@sm120fork/0 DECIDE {"2": "fused"}' in error


def test_ctrl_c_ends_the_peer_probes_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer probe's children are the runner's: end_children (what the doctor's error
    boundary calls on Ctrl-C or SIGTERM) ends them, with their process groups."""
    fake_child_env(tmp_path, monkeypatch)
    child = ipc._Process(0, 0, 1, "fake_ipc_child")
    try:
        assert child.receive(time.monotonic() + 60, ipc.Shared)   # set up and answering
        assert proc.end_children(grace=10) >= 1
        assert child.proc.poll() is not None
    finally:
        proc.allow_children()
        child.close()


def test_collapsed_peer_writes_warn_at_the_tp_size_they_hit() -> None:
    links = [link(w, o, write=2.6 if (w, o) == (1, 0) else 50.0, read=52.0)
             for w, o in ((0, 1), (1, 0))]
    report = rules.judge(box(2, links=links))
    assert report.text_of("tp") == [
        "--tp 2 ok on GPUs 0-1 (one socket: NUMA node 0); warning: peer writes collapse: "
        "GPU 1 -> GPU 0 writes 2.6 GB/s against 52.0 GB/s reads; the lamport one-shot kernel "
        "pushes to every peer, so measure before enabling fusion at this size"]


def test_a_peer_that_fails_blocks_only_the_tp_sizes_that_use_it() -> None:
    facts = box(4)
    facts["peers"]["links"] = [link(w, o, ok=(w, o) != (3, 2))
                               for a in range(4) for b in range(a + 1, 4)
                               for w, o in ((a, b), (b, a))]
    report = rules.judge(facts)
    assert report.text_of("tp") == [
        "--tp 2 ok on GPUs 0-1 (one socket: NUMA node 0)",
        "--tp 4 NOT on GPUs 0-3: GPU 3 -> GPU 2: vmm write: 1024 of 1024 words wrong; ipc "
        "write: 1024 of 1024 words wrong"]
    assert report.blockers == []


# --- item 5: decisions, and text agreeing with JSON -----------------------------------------

def test_sm120fork_plugin_0_is_off_in_text_and_json(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    facts = box(2, environ={"SM120FORK_PLUGIN": "0"})
    _, text = run(facts, tmp_path, capsys=capsys)
    assert "plugin sm120fork-sglang-plugin 0.5.23+sm120.1: off: SM120FORK_PLUGIN=0 " \
           "disables it" in text
    assert "would apply, but the plugin is off" in text
    assert ": applied" not in text
    assert "active" not in text
    cli.main(["--facts", str(tmp_path / "facts.json"), "--json"])
    assert json.loads(capsys.readouterr().out)["packages"]["plugin_active"] is False


def test_a_whitelist_without_the_plugin_is_not_called_active(tmp_path: Path) -> None:
    report = rules.judge(box(2, environ={"SGLANG_PLUGINS": "other"}))
    plugin_line = next(t for _, t in report.lines if t.startswith("plugin "))
    assert plugin_line.endswith("off: SGLANG_PLUGINS=other does not list 'sm120fork', so "
                                "SGLang never loads it")
    assert report.sections["packages"]["plugin_active"] is False


def test_the_fix_hint_points_at_the_plugin_folder() -> None:
    facts = box(2, packages={probe.PLUGIN_DISTRIBUTION: None}, plugin=None)
    hint = next(b for b in blockers(facts) if b.startswith("sglang: stock sglang 0.5.23"))
    assert "wheels/<stack>/plugin/sm120fork_sglang_plugin-*.whl" in hint


def test_an_sglang_without_a_plugin_framework_is_not_offered_the_plugin(tmp_path: Path) -> None:
    facts = box(2, packages={"sglang": "0.5.10.post1", probe.PLUGIN_DISTRIBUTION: None},
                plugin=None, sglang_plugin_framework=False)
    hint = next(b for b in blockers(facts) if b.startswith("sglang: stock sglang 0.5.10"))
    assert "no plugin framework" in hint
    assert "sm120fork_sglang_plugin" not in hint
    (tmp_path / "sglang" / "srt" / "plugins").mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "srt" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        assert probe.has_plugin_framework() is False
        (tmp_path / "sglang" / "srt" / "plugins" / "__init__.py").write_text("")
        assert probe.has_plugin_framework() is True
    finally:
        sys.path.remove(str(tmp_path))


def test_stack_0523s_as_published_flashinfer_is_not_installed_over_ours() -> None:
    patched = box(2, packages={"sglang": "0.5.23+sm120.1", probe.PLUGIN_DISTRIBUTION: None},
                  plugin=None)
    info = rules.judge(patched).sections["packages"]
    assert info["flashinfer_kind"] == "as published: this stack uses it unpatched"
    default = box(2, packages={"sglang": "0.5.10.post1+sm120.1",
                               "flashinfer-python": "0.6.7.post3",
                               probe.PLUGIN_DISTRIBUTION: None}, plugin=None,
                  requires={"sglang": ["flashinfer_python==0.6.7.post3+sm120.1"]})
    assert rules.judge(default).sections["packages"]["flashinfer_kind"] == \
        "stock, installed over ours"


def test_a_single_gpu_spark_is_never_asked_about_tp2(tmp_path: Path) -> None:
    asked: list[Sequence[int]] = []
    facts = box(1, capability="12.1")
    probes = stub_probes(facts)
    def decisions(sizes: Sequence[int]) -> dict[str, Any]:
        asked.append(sizes)
        return {}

    probes = probe.Probes(**{**probes.__dict__, "decisions": decisions})
    collected = probe.collect(probes)
    assert asked == []
    assert collected["decisions"] is None
    report = rules.judge(collected)
    assert report.text_of("tp") == ["one GPU: --tp 1 only; the fused all-reduce needs --tp 2 "
                                    "or more"]
    assert report.text_of("decisions") == ["--tp decisions skipped: 1 GPU: no --tp above 1 "
                                           "fits on this box"]
    assert not any("TP2" in t or "fusion on" in t for _, t in report.lines)


def test_a_tp_asked_for_beyond_the_gpus_still_shows_sglangs_decision() -> None:
    """One GPU, ``--tp 2`` asked (e.g. after ``tune`` measured TP2 with ranks sharing the
    GPU): SGLang's own decision for TP2 is asked and shown, and the box's blocker stays."""
    asked: list[Sequence[int]] = []
    facts = box(1, capability="9.0")
    probes = stub_probes(facts)

    def decisions(sizes: Sequence[int]) -> dict[str, Any]:
        asked.append(list(sizes))
        return {"model": "Qwen3MoeForCausalLM", "source": "arg_groups", "plugins_loaded": True,
                "decisions": [{"tp": 2, "fusion": False, "backend": None,
                               "line": "TP2: policy ~/p.json is marked not for use"}]}

    probes = probe.Probes(**{**probes.__dict__, "decisions": decisions})
    collected = probe.collect(probes, extra_tp=[2])
    assert asked == [[2]]
    report = rules.judge(collected, tp=[2])
    assert report.text_of("decisions") == [
        "--tp 2 (Qwen3MoeForCausalLM, SGLang's arg_groups code): fusion off: TP2: policy "
        "~/p.json is marked not for use"]
    assert report.text_of("tp") == ["--tp 2 NOT on GPUs 0-1: needs GPUs 0-1, this box shows 1"]


def test_without_a_gpu_the_text_says_what_was_skipped(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    facts = box(2)
    facts["gpus"] = {"driver": None, "devices": [], "p2p": [], "error": "no NVIDIA driver"}
    collected = probe.collect(stub_probes(facts))
    code, text = run(collected, tmp_path, capsys=capsys)
    assert code == DoctorError.exit_code
    assert "[comm module]\n  skipped: no GPU visible: FlashInfer picks its architectures" in text
    assert "[decisions]\n  --tp decisions skipped: no GPU visible" in text


def fake_sglang(root: Path, flavour: str) -> None:
    """SGLang packages shaped like 0.5.10 (ServerArgs) or 0.5.23 (arg_groups + plugins)."""
    srt = root / "sglang" / "srt"
    srt.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (srt / "__init__.py").write_text("")
    if flavour == "server_args":
        (srt / "server_args.py").write_text('''
import dataclasses, logging
logger = logging.getLogger(__name__)
@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tp_size: int = 1
    enable_flashinfer_allreduce_fusion: bool = False
    def get_model_config(self):
        return self.model_config
    def _handle_model_specific_adjustments(self):
        arch = self.get_model_config().hf_config.architectures[0]
        if self.tp_size == 2 and arch == "Qwen3MoeForCausalLM":
            self.enable_flashinfer_allreduce_fusion = True
            logger.info("Auto-enabling FlashInfer AllReduce Fusion on SM12x for %s", arch)
        else:
            logger.info("FlashInfer AllReduce Fusion on SM12x (TP%d): not auto-enabled",
                        self.tp_size)
''')
        return
    (srt / "plugins").mkdir()
    (srt / "plugins" / "__init__.py").write_text("LOADED = []\ndef load_plugins():\n"
                                                 "    LOADED.append(1)\n")
    (srt / "arg_groups").mkdir()
    (srt / "arg_groups" / "__init__.py").write_text("")
    (srt / "arg_groups" / "overrides.py").write_text('''
import logging
logger = logging.getLogger(__name__)
def _flashinfer_allreduce_fusion_auto_enable(view):
    from sglang.srt.plugins import LOADED
    if LOADED and view.tp_size == 2 and model_config_of(view).hf_config.architectures:
        logger.info("Auto-enabling FlashInfer AllReduce Fusion (plugin loaded)")
        return {"flashinfer_allreduce_fusion_backend": "trtllm"}
    logger.info("sm120fork %s", "all-reduce at TP4: SGLang's own code, as upstream (policy "
                "p.json is marked not for use (shared GPU))")
    logger.info("FlashInfer AllReduce Fusion not auto-enabled")
    return {}
''')


@pytest.mark.parametrize("flavour", ["server_args", "arg_groups"])
def test_each_sglang_decides_with_its_own_code(tmp_path: Path, flavour: str) -> None:
    fake_sglang(tmp_path, flavour)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    done = subprocess.run([sys.executable, "-m", "sm120fork.doctor.decide", "2", "4"], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    result = wire.last(done.stdout, "DECIDE")
    assert result["source"] == flavour
    assert result["plugins_loaded"] is (flavour == "arg_groups")
    assert [(d["tp"], d["fusion"]) for d in result["decisions"]] == [(2, True), (4, False)]
    assert result["decisions"][0]["line"].startswith("Auto-enabling FlashInfer AllReduce Fusion")
    if flavour == "arg_groups":
        # the policy's own line (G7, the plugin) is kept apart from SGLang's decision line
        assert result["decisions"][1]["line"] == "FlashInfer AllReduce Fusion not auto-enabled"
        assert result["decisions"][1]["policy_lines"] == [
            "sm120fork all-reduce at TP4: SGLang's own code, as upstream (policy p.json is "
            "marked not for use (shared GPU))"]
        assert result["decisions"][0]["policy_lines"] == []
        facts = box(2)
        facts["decisions"] = result
        lines = rules.judge(facts, tp=[4]).text_of("decisions")
        assert ("  SGLang logged: sm120fork all-reduce at TP4: SGLang's own code, as "
                "upstream (policy p.json is marked not for use (shared GPU))") in lines


# --- item 6: the committed scenarios ------------------------------------------------------

SCENARIO_NAMES = sorted(p.name for p in SCENARIOS.iterdir() if p.is_dir()) \
    if SCENARIOS.is_dir() else []


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_committed_scenario_is_judged_as_its_verdict_says(name: str) -> None:
    folder = SCENARIOS / name
    expect = json.loads((folder / "expect.json").read_text())
    facts = cli.read_facts(folder / "facts.json")
    report = rules.judge(facts, tp=expect.get("tp", []))
    assert cli.render(report) == (folder / "verdict.txt").read_text()
    assert len(report.blockers) == expect["blockers"]
    for line in expect["lines"]:
        assert any(line in t for _, t in report.lines) or any(line in b for b in
                                                               report.blockers), line


def test_the_scenarios_cover_the_boxes_issue_20_names() -> None:
    assert set(SCENARIO_NAMES) >= {
        "8x-rtx-pro-6000-pcie-cross-socket-p2p-off", "4x-one-pcie-switch",
        "dgx-spark-sm121-single-gpu", "no-nvcc-torch-cuda-12.8", "stale-stock-jit-cache",
        "aot-marker-digest-mismatch", "h200"}


# --- the driver glue and the CLI ----------------------------------------------------------

def test_no_driver_is_a_blocker_on_this_machine() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(CudaError, match="no NVIDIA driver"):
        Driver()
    facts = probe.collect(probe.Probes(decisions=lambda s: {"error": "skipped"}))
    assert rules.judge(facts).blockers[0].startswith("GPUs: no NVIDIA driver")


@pytest.mark.nvcc
def test_the_copy_kernel_assembles_for_sm90_and_sm12x(tmp_path: Path) -> None:
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not Path(ptxas).exists():
        pytest.skip("no ptxas")
    source = tmp_path / "k.ptx"
    source.write_bytes(COPY_KERNEL_PTX)
    for arch in ("sm_90", "sm_120", "sm_121"):
        subprocess.run([ptxas, f"-arch={arch}", str(source), "-o", str(tmp_path / arch)],
                       check=True)


def test_toolkit_verb_runs_outside_a_checkout(tmp_path: Path) -> None:
    """No GPU to be seen (as on CI): the verb still runs, says so as a blocker, exits 15."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "sm120fork", "doctor", "--json",
                           "--python", sys.executable],
                          cwd=tmp_path, capture_output=True, text=True, env=env, check=False,
                          timeout=300)
    report = json.loads(done.stdout)
    assert done.returncode == DoctorError.exit_code, done.stderr
    assert report["blockers"]
    assert report["blockers"][0].startswith("GPUs: ")
    assert set(report) >= {"gpus", "packages", "comm_module", "environment", "blockers",
                           "text"}


@pytest.mark.parametrize("drop", [False, True])
def test_driver_glue_against_a_host_memory_libcuda(tmp_path: Path, drop: bool) -> None:
    """The ctypes calls (argument packing, the IPC handle by value, the VMM structs, kernel
    parameters, the FD relay) against a stand-in libcuda.so.1 whose "kernel" copies on the
    host."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"),
                    str(TESTS / "fake_libcuda.c")], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), FAKE_CUDA_MAP=str(tmp_path / "map"),
               PYTHONPATH=os.pathsep.join(sys.path))
    if drop:
        env["FAKE_DROP"] = "1"
    try:
        done = subprocess.run([sys.executable, "-m", "sm120fork.doctor", "--json",
                               "--python", sys.executable], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
    finally:
        for line in (tmp_path / "map").read_text().splitlines():
            Path(line.split()[1]).unlink(missing_ok=True)
    report = json.loads(done.stdout)
    assert [d["name"] for d in report["gpus"]["devices"]] == ["Fake GPU 0", "Fake GPU 1"]
    assert [d["pci_bus_id"] for d in report["gpus"]["devices"]] == ["0000:3B:00.0",
                                                                    "0000:3C:00.0"]
    links = {(p["writer_gpu"], p["owner_gpu"]): p for p in report["peers"]["links"]}
    for p in links.values():
        assert p["error"] is None, p
        assert p["write_gbps"] > 0
        assert p["read_gbps"] > 0
        for kind in ("vmm", "ipc"):
            assert p["sharing"][kind]["open"] == "ok"
            assert p["sharing"][kind]["read"] == "ok"
            assert p["sharing"][kind]["write"] == ("1024 of 1024 words wrong" if drop else "ok")
    assert set(links) == {(0, 1), (1, 0)}


def test_an_unchanged_copy_of_the_facts_judges_the_same() -> None:
    facts = cross_socket()
    assert rules.judge(copy.deepcopy(facts)).to_json() == rules.judge(facts).to_json()


def test_the_docs_show_a_verdict_the_rules_give() -> None:
    readme = (ROOT / "docs" / "doctor.md").read_text()
    example = readme.partition("    $ sm120fork-doctor --tp 2\n")[2].partition(
        "    [blockers] 0\n")[0]
    shown = [x.strip() for x in example.splitlines() if x.strip() and "..." not in x]
    verdict = (SCENARIOS / "8x-rtx-pro-6000-pcie-cross-socket-p2p-off" / "verdict.txt")
    facts = cli.read_facts(verdict.with_name("facts.json"))
    facts["made_by"]["executable"] = "/srv/venv/bin/python"
    report = rules.judge(facts, tp=[2])
    report.examined(facts, "the Python sm120fork-doctor is installed in; --python names another")
    judged = [x.strip() for x in cli.render(report).splitlines()]
    assert len(shown) > 10
    assert [x for x in shown if x not in judged] == []


def test_a_capability_without_a_floor_says_so() -> None:
    fi = flashinfer()
    fi["archs"] = {"9.0": {"arch": "90a", "floor": None}}
    report = rules.judge(box(1, capability="9.0", flashinfer=fi))
    assert "compute capability 9.0: builds for compute_90a (no CUDA floor of its own)" in \
        report.text_of("comm module")


def test_visible_devices_renumber_the_gpus_and_the_text_says_so() -> None:
    facts = cross_socket()
    facts["environ"] = {"CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3"}
    report = rules.judge(facts)
    assert report.text_of("gpus")[1] == ("GPU numbers are CUDA's, as SGLang numbers them: "
                                         "after CUDA_VISIBLE_DEVICES=4,5,6,7,0,1,2,3")
    assert report.text_of("tp")[1] == "--tp 4 ok on GPUs 0-3 (one socket: NUMA node 0)"


def test_a_record_hides_pythonpath_install_folders(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "target"
    monkeypatch.setenv("PYTHONPATH", f"{target}{os.pathsep}/elsewhere")
    facts = box(2)
    facts["flashinfer"]["aot_dir"] = f"{target}/flashinfer/data/aot"
    out: Any = probe.portable(facts)
    assert out["flashinfer"]["aot_dir"] == "<site-packages>/flashinfer/data/aot"


def test_one_gpu_whose_processes_cannot_share_memory_is_warned_not_blocked() -> None:
    facts = box(1, capability="12.1")
    for x in facts["peers"]["links"]:
        x["sharing"]["vmm"]["open"] = "cuMemImportFromShareableHandle failed: CUDA_ERROR_FAKE"
        x["ok"] = False
        x["detail"] = "vmm open: cuMemImportFromShareableHandle failed: CUDA_ERROR_FAKE"
    report = rules.judge(facts)
    assert report.blockers == []
    assert report.text_of("peers")[-1].startswith(
        "warning: vmm open: cuMemImportFromShareableHandle failed: CUDA_ERROR_FAKE between two "
        "processes on one GPU")


# --- issue 22: the all-reduce policy per TP size ------------------------------------------

def _point(method: str, tokens: int, us: float | None, status: str = "timed",
           hidden: int = 4096) -> dict[str, Any]:
    rec: dict[str, Any] = {"kind": "point", "method": method, "tokens": tokens,
                           "hidden": hidden, "status": status}
    if us is not None:
        rec.update(median_us=us, rank_medians_us=[us])
    return rec


def measured_policy(*, for_use: bool = True, **made: Any) -> dict[str, Any]:
    """TP2: fused_auto wins 1-64, pcie_ipc from 512 on, the vLLM custom AR fails its check;
    TP4: NCCL beats the fused path from 1 token on.  TP8 was not measured."""
    tp2 = [_point("fused_auto", 1, 5), _point("pcie_ipc_rmsnorm", 1, 8),
           _point("fused_auto", 64, 9), _point("pcie_ipc_rmsnorm", 64, 10),
           _point("fused_auto", 512, 40), _point("pcie_ipc_rmsnorm", 512, 20),
           _point("custom_vllm_rmsnorm", 1, None, "failed_check")]
    tp4 = [_point("fused_auto", 1, 9), _point("nccl_rmsnorm", 1, 8),
           _point("fused_auto", 512, 50), _point("nccl_rmsnorm", 512, 45)]
    return allreduce_policy.derive({2: tp2, 4: tp4}, for_use=for_use, made={
        "created": "2026-12-01", "gpu": "RTX PRO 6000", "gpu_count": 8, **made})


def with_policy(doc: Any, *, path: str = "/srv/policy.json", **extra: Any) -> Any:
    facts = box(8, **extra)
    facts["policy"] = {"path": path, "named_by": allreduce_policy.ENV_VAR,
                       "found": doc is not None, "document": doc, "error": None}
    return facts


def test_off_sm12x_a_tp_size_no_policy_decides_is_sglangs_own_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the H200 (SM90) after tune made a shared-GPU policy (not for use), the doctor
    said "today's rule: our fused path at TP2 only", an SM12x rule: SM90 SGLang runs its
    own code unchanged there (fusion at any TP for its models), which [decisions] shows."""
    doc = measured_policy(for_use=False, shared_gpu=True, gpu="NVIDIA H200", gpu_count=1,
                          note="ranks shared a GPU")
    facts = with_policy(doc, capability="9.0")
    _, text = run(facts, tmp_path, capsys=capsys)
    section = [x[2:] for x in text.split("[policy]\n", 1)[1].split("\n[", 1)[0].splitlines()]
    tp_lines = [x for x in section if x.startswith("all-reduce at TP")]
    assert tp_lines == [
        f"all-reduce at TP{t}: SGLang's own code, as upstream (SM9x: without a policy SGLang "
        "follows here, the patches change nothing; what it decides is under [decisions])"
        for t in (2, 4, 8)]
    assert "  measured (not followed): 1-64: fused_auto, 65-512: pcie_ipc_rmsnorm" in section
    # on SM12x the same file leaves SGLang on the fork's TP-gated rule, said as such
    facts = with_policy(doc)
    _, text = run(facts, tmp_path, capsys=capsys)
    assert "all-reduce at TP8: nccl_rmsnorm for 1+ tokens (today's rule: our fused path at " \
        "TP2 only; policy /srv/policy.json is marked not for use (ranks shared a GPU))" in text


def test_the_doctor_prints_the_policy_per_tp_size_in_text_and_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(with_policy(measured_policy()), tmp_path, capsys=capsys)
    section = [x[2:] for x in text.split("[policy]\n", 1)[1].split("\n[", 1)[0].splitlines()]
    assert section == [
        "policy file: /srv/policy.json (named by SGLANG_SM120_ALLREDUCE_POLICY)",
        "format sm120fork-allreduce-policy version 2, measured 2026-12-01 on RTX PRO 6000 "
        "x8; for use: SGLang follows it",
        "all-reduce at TP2: fused_auto for 1-64, pcie_ipc_rmsnorm for 65-512, nccl_rmsnorm "
        "for 513+ tokens (policy /srv/policy.json, measured 2026-12-01 on RTX PRO 6000 x8)",
        "  TP2: custom_vllm_rmsnorm left out: failed its output check at 1 tokens, hidden 4096",
        "all-reduce at TP4: nccl_rmsnorm for 1+ tokens (policy /srv/policy.json, measured "
        "2026-12-01 on RTX PRO 6000 x8)",
        "all-reduce at TP8: nccl_rmsnorm for 1+ tokens (today's rule: our fused path at TP2 "
        "only; the policy has no entry for TP8)"]
    assert cli.main(["--facts", str(tmp_path / "facts.json"), "--json"]) == code
    report = json.loads(capsys.readouterr().out)
    assert report["text"]["policy"] == section
    shown = report["policy"]
    assert shown["applies"] is True
    assert shown["read_by_sglang"] is True
    assert (shown["source"]["path"], shown["source"]["version"],
            shown["source"]["for_use"]) == ("/srv/policy.json", 2, True)
    assert [(t["tp"], t["decided_by"]) for t in shown["tp"]] == [
        (2, "policy"), (4, "policy"), (8, "today's rule")]
    assert [(r["min_tokens"], r["max_tokens"], r["method"])
            for r in shown["tp"][0]["ranges"]] == [(1, 64, "fused_auto"),
                                                   (65, 512, "pcie_ipc_rmsnorm"),
                                                   (513, None, "nccl_rmsnorm")]


def test_a_method_the_box_cannot_run_falls_back_with_one_line_each() -> None:
    """FlashInfer without pcie_ipc (0.6.x): TP2's 65-512 range falls back to the next
    measured method, and the doctor says so once."""
    facts = with_policy(measured_policy(), modules={
        "asked": decision.needed_names(),
        "present": ["flashinfer.comm:trtllm_allreduce_fusion"]})
    lines = rules.judge(facts).text_of("policy")
    assert lines[2:4] == [
        "all-reduce at TP2: fused_auto for 1-512, nccl_rmsnorm for 513+ tokens (policy "
        "/srv/policy.json, measured 2026-12-01 on RTX PRO 6000 x8)",
        "  TP2 tokens 65-512: pcie_ipc_rmsnorm cannot run here "
        "(flashinfer.comm:PcieIpcAllReduceWorkspace does not import here); falling back to "
        "fused_auto"]


def test_without_a_policy_the_doctor_says_what_sglang_decides_instead() -> None:
    report = rules.judge(with_policy(None))
    rule = "today's rule: our fused path at TP2 only; no policy at /srv/policy.json"
    assert report.text_of("policy")[1:] == [
        "no policy there: SGLang keeps today's decision",
        f"all-reduce at TP2: fused_auto for 1+ tokens ({rule})",
        f"all-reduce at TP4: nccl_rmsnorm for 1+ tokens ({rule})",
        f"all-reduce at TP8: nccl_rmsnorm for 1+ tokens ({rule})"]
    shown = report.to_json()["policy"]
    assert shown["applies"] is False
    assert [(t["tp"], t["decided_by"]) for t in shown["tp"]] == [
        (2, "today's rule"), (4, "today's rule"), (8, "today's rule")]
    assert not report.blockers


def test_a_policy_made_on_a_shared_gpu_is_shown_and_not_followed() -> None:
    doc = measured_policy(for_use=False, shared_gpu=True, note="made on a shared GPU")
    report = rules.judge(with_policy(doc))
    lines = report.text_of("policy")
    assert lines[1] == ("format sm120fork-allreduce-policy version 2, measured 2026-12-01 "
                        "on RTX PRO 6000 x8, on a shared GPU; marked NOT FOR USE (made on a "
                        "shared GPU): SGLang ignores it and keeps today's decision")
    assert lines[2:4] == [
        "all-reduce at TP2: fused_auto for 1+ tokens (today's rule: our fused path at TP2 "
        "only; policy /srv/policy.json is marked not for use (made on a shared GPU))",
        "  measured (not followed): 1-64: fused_auto, 65-512: pcie_ipc_rmsnorm"]
    source = report.to_json()["policy"]["source"]
    assert (source["for_use"], source["shared_gpu"]) == (False, True)
    assert [t["decided_by"] for t in report.to_json()["policy"]["tp"]] == ["today's rule"] * 3


def test_a_policy_sglang_cannot_use_names_the_key() -> None:
    doc = {**measured_policy(), "version": 3}
    lines = rules.judge(with_policy(doc)).text_of("policy")
    assert lines[1] == ("not usable (/srv/policy.json: version: policy version 3: this "
                        "reader takes versions 2 (re-make it with this toolkit: nox -s "
                        "tune -- --stack NAME)): SGLang keeps today's decision")
    assert lines[2].startswith("all-reduce at TP2: fused_auto for 1+ tokens (today's rule")


def test_a_version_1_policy_is_shown_as_refused() -> None:
    v1 = {"format": "sm120fork-allreduce-policy", "version": 1, "for_use": True,
          "made": {"created": "2026-12-01", "gpu": "RTX PRO 6000", "gpu_count": 8},
          "tp": {"2": {"fused_max_tokens": 64, "ranges": []}}}
    lines = rules.judge(with_policy(v1)).text_of("policy")
    assert lines[1] == ("not usable (/srv/policy.json: version: policy version 1: this "
                        "reader takes versions 2 (re-make it with this toolkit: nox -s "
                        "tune -- --stack NAME)): SGLang keeps today's decision")
    assert lines[2].startswith("all-reduce at TP2: fused_auto for 1+ tokens (today's rule")


def test_the_override_turns_the_fused_path_off_and_the_ranges_still_hold() -> None:
    facts = with_policy(measured_policy(), environ={allreduce_policy.AUTO_ENV: "0"})
    report = rules.judge(facts)
    lines = report.text_of("policy")
    assert ("SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO=0 decides our fused path's "
            "auto-enable (the policy's ranges still hold)") in lines
    assert ("all-reduce at TP2: pcie_ipc_rmsnorm for 1-512, nccl_rmsnorm for 513+ tokens "
            "(policy /srv/policy.json, measured 2026-12-01 on RTX PRO 6000 x8)" in lines)
    tp2 = report.to_json()["policy"]["tp"][0]
    assert tp2["fallbacks"] == [
        "TP2 tokens 1-64: fused_auto cannot run here (SGLANG_SM120_FLASHINFER_ALLREDUCE_"
        "FUSION_AUTO=0 turns our fused path off); falling back to pcie_ipc_rmsnorm"]


def test_stock_sglang_without_the_plugin_reads_no_policy() -> None:
    facts = with_policy(measured_policy(),
                        packages={probe.PLUGIN_DISTRIBUTION: None}, plugin=None)
    report = rules.judge(facts)
    assert ("sglang 0.5.23 (stock) reads no policy (our patched SGLang does, and our plugin "
            "when it is on); what ours would decide:") in report.text_of("policy")
    assert report.to_json()["policy"]["read_by_sglang"] is False


def test_the_probe_finds_the_policy_sglang_reads_and_a_record_names_home_by_role(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    allreduce_policy.write(measured_policy(), tmp_path / ".config" / "sm120fork")
    (tmp_path / ".config" / "sm120fork" / "policy.json").rename(
        allreduce_policy.locate({}))
    every: Modules = {"asked": decision.needed_names(), "present": decision.needed_names()}
    facts = probe.collect(probe.Probes(gpus=lambda: {"driver": None, "devices": [], "p2p": [],
                                                     "error": "no GPU (test)"},
                                       decisions=lambda s: {"error": "skipped"},
                                       modules=lambda: every, environ={}))
    found = facts["policy"]
    assert found is not None
    assert found["found"] is True
    assert found["document"]["tp"]["2"]["ranges"][0]["max_tokens"] == 64
    recorded = probe.portable(facts, home=tmp_path)
    assert (recorded["policy"] or {})["path"] == allreduce_policy.DEFAULT_PATH
    lines = rules.judge(recorded).text_of("policy")
    assert lines[0] == (f"policy file: {allreduce_policy.DEFAULT_PATH} (the default place; "
                        "SGLANG_SM120_ALLREDUCE_POLICY names another)")
    assert lines[2].startswith("all-reduce at TP2: fused_auto for 1-64, ")
    named = probe.collect(probe.Probes(
        gpus=lambda: {"driver": None, "devices": [], "p2p": [], "error": "no GPU (test)"},
        decisions=lambda s: {"error": "skipped"},
        environ={allreduce_policy.ENV_VAR: str(tmp_path / "elsewhere.json")}))
    found = named["policy"]
    assert found is not None
    assert (found["found"], found["named_by"]) == (
        False, allreduce_policy.ENV_VAR)
    assert named["environ"] == {allreduce_policy.ENV_VAR: str(tmp_path / "elsewhere.json")}


# --- issue 33 item 4: the doctor looks at the environment SGLang serves from -------------

def serving_venv(root: Path, sglang: str | None) -> Path:
    """A venv with no toolkit, holding ``sglang`` (its metadata only) when given."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python3"
    if sglang is not None:
        purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                                  "print(sysconfig.get_paths()['purelib'])"], check=True,
                                 capture_output=True, text=True).stdout.strip()
        info = Path(purelib) / f"sglang-{sglang}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {sglang}\n")
    return python


def test_the_doctor_runs_in_the_serving_interpreter(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--python: a venv with no toolkit, whose sglang this test's environment lacks."""
    python = serving_venv(tmp_path / "serving", "0.5.23")
    assert probe.installed("sglang") is None
    code = cli.main(["--python", str(python), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["packages"]["sglang"] == "0.5.23"
    assert report["python"] == {"path": str(python), "why": "named by --python"}
    assert report["made_by"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert code in (0, 15)


def pyenv_exec_path(root: Path) -> list[str]:
    """What ``pyenv exec`` (pyenv's ``nox`` shim) puts first on PATH: the version's bin
    (with its python3), pyenv's libexec and its plugins' bin folders."""
    version, libexec, plugin = (root / "versions/3.11.7/bin", root / "libexec",
                                root / "plugins/pyenv-virtualenv/bin")
    for folder in (version, libexec, plugin):
        folder.mkdir(parents=True)
    (version / "python3").symlink_to(sys.executable)
    (libexec / "pyenv-exec").write_text("#!/bin/sh\n")
    (libexec / "pyenv-exec").chmod(0o755)
    return [str(version), str(libexec), str(plugin)]


@pytest.mark.parametrize("launcher", ["shell", "nox", "pyenv's nox shim",
                                      "a venv activated in a shell that pyenv exec started"])
def test_by_default_the_doctor_examines_python3_on_path_and_says_so_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        launcher: str) -> None:
    """Issue 42: not the toolkit's own environment (nox's, which nox puts first on PATH),
    nor pyenv's version of Python that its ``nox`` shim puts before an activated venv; but a
    venv put before a PATH that ``pyenv exec`` made (CI runs the suite that way) is the one."""
    python = serving_venv(tmp_path / "serving", "0.5.10.post1+sm120.1")
    path = [str(python.parent), os.environ["PATH"]]
    if "pyenv" in launcher:
        monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
        where = 0 if launcher == "pyenv's nox shim" else 1  # before the venv, or after it
        path[where:where] = pyenv_exec_path(tmp_path / "pyenv")
    if launcher != "shell":
        monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")
        monkeypatch.setenv("NOX_CURRENT_SESSION", "doctor")
        path.insert(0, str(Path(sys.prefix) / "bin"))
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    cli.main([])
    text = capsys.readouterr().out
    assert text.splitlines()[0] == (f"doctor of {python} (python3 on PATH; --python names "
                                    "another)")
    assert "sglang 0.5.10.post1+sm120.1 (ours)" in text


def test_a_python_without_sglang_is_named_once_not_as_27_hooks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    python = serving_venv(tmp_path / "bare", None)
    monkeypatch.setenv("PATH", os.pathsep.join([str(python.parent), os.environ["PATH"]]))
    assert cli.main([]) == DoctorError.exit_code
    assert f"  SGLang is not installed in {python}\n" in capsys.readouterr().out
    # the plugin wheel beside no SGLang: its hooks cannot apply, and that is not the cause
    facts = box(2, packages={"sglang": None})
    facts["made_by"]["executable"] = "/srv/venv/bin/python"
    facts["plugin"]["hooks"] = [{"hook": f"G{i}", "state": "not applied",
                                 "why": "sglang is not installed"} for i in range(27)]
    report = rules.judge(facts)
    assert report.text_of("packages")[1:] == [
        "SGLang is not installed in /srv/venv/bin/python",
        "plugin sm120fork-sglang-plugin 0.5.23+sm120.1: off: it has no SGLang to apply to"]
    assert [b.partition(" (")[0] for b in report.blockers] == [
        "SGLang is not installed in /srv/venv/bin/python"]
    # its fix is the SGLang the plugin is for, not a stack's wheels (another route)
    assert report.blockers[0].endswith("or install the SGLang its plugin 0.5.23+sm120.1 is for "
                                       "there: pip install sglang==0.5.23)")


@pytest.mark.parametrize(("argv", "says"), [
    (["--python", "/no/such/python"], "--python /no/such/python: no such interpreter"),
    (["--python", "python3", "--facts", "x.json"], "--facts judges a record; --python"),
])
def test_a_bad_python_is_named(argv: list[str], says: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) != 0
    assert says in capsys.readouterr().err


def test_the_doctor_says_when_the_installed_sglang_reads_version_1_only() -> None:
    """The decisions probe runs SGLang's own start-up with the file in place: a version 1
    reader's refusal is shown, not 'SGLang follows it'."""
    facts = with_policy(measured_policy())
    for d in facts["decisions"]["decisions"]:
        d["line"] = ("FlashInfer AllReduce Fusion on SM12x (TP2): default rule: /srv/policy.json "
                     "is not an sm120fork all-reduce policy (version 1)")
    report = rules.judge(facts)
    assert ("the installed SGLang reads version 1 only and ignores this file (it keeps "
            "today's rule; its own line is under [decisions]): what the version 2 decision "
            "would be:") in report.text_of("policy")
    assert report.to_json()["policy"]["read_by_sglang"] is False
    assert rules.judge(with_policy(measured_policy())).to_json()["policy"][
        "read_by_sglang"] is True


def test_no_python3_on_path_is_answered_with_the_command_that_names_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")
    monkeypatch.setenv("NOX_CURRENT_SESSION", "doctor")
    assert cli.main([]) == UsageError.exit_code
    assert capsys.readouterr().err.rstrip().endswith(
        "no python3 on PATH to examine (name the Python SGLang serves from: nox -s doctor -- "
        "--python /path/to/python)")
