"""The doctor's checks: facts about this box, and one line per blocker.

Everything the checks ask of the machine goes through ``Probes`` (the GPU driver, the
IPC peer-write probe, installed packages, files, nvcc, the SGLang decision), so tests
stub the machine and keep the judgement real.  Needs no package index and no nvcc.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cuda import CudaError, Device, Driver
from .ipc import PairResult
from .ipc import probe as ipc_probe

PLUGIN_DISTRIBUTION = "sm120fork-sglang-plugin"
PLUGIN_PACKAGE = "sm120fork_sglang_plugin"
PLUGIN_ENTRY_POINT = "sm120fork"
OUR_LABEL = "sm120"
COMM_MODULE = "trtllm_comm"

#: Environment variables that change what SGLang/FlashInfer/NCCL do with the fused path.
OVERRIDES = (
    "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO", "SGLANG_SM120_FLASHINFER_PLAIN_ALLREDUCE",
    "SM120FORK_PLUGIN", "SGLANG_PLUGINS", "SGLANG_PLATFORM", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
    "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_DISABLE_VERSION_CHECK",
    "FLASHINFER_DISABLE_JIT", "CUDA_HOME", "CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
)


# --- what the checks ask of the machine ----------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class GpuFacts:
    driver: str | None               # "13.0"
    devices: tuple[Device, ...]
    p2p: tuple[tuple[bool, ...], ...]
    error: str | None = None


def query_gpus() -> GpuFacts:
    try:
        drv = Driver()
        version = drv.version()
        devices = tuple(drv.device(i) for i in range(drv.count()))
        p2p = tuple(tuple(a == b or drv.can_access_peer(a, b) for b in range(len(devices)))
                    for a in range(len(devices)))
    except CudaError as exc:
        return GpuFacts(driver=None, devices=(), p2p=(), error=str(exc))
    return GpuFacts(driver=f"{version // 1000}.{version % 1000 // 10}", devices=devices, p2p=p2p)


def cuda_runtime() -> str | None:
    """The CUDA runtime SGLang runs with: torch's."""
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        torch = importlib.import_module("torch")
    except Exception as exc:
        return f"unknown (import torch failed: {type(exc).__name__})"
    version = getattr(getattr(torch, "version", None), "cuda", None)
    return "none (torch is a CPU build)" if version is None else str(version)


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def plugin_report() -> list[dict[str, str]] | str:
    """Our plugin's per-hook verdict for the installed SGLang (without applying anything)."""
    try:
        plugin = importlib.import_module(PLUGIN_PACKAGE)
        runtime = importlib.import_module(f"{PLUGIN_PACKAGE}.plugin.runtime")
        return [s.to_json() for s in runtime.evaluate(plugin.spec())]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def nvcc_version() -> tuple[str, str] | None:
    """(path, "13.0") of the nvcc FlashInfer's JIT would use, or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [str(Path(home) / "bin" / "nvcc")] if home else []
    candidates += [p for p in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc") if p]
    for path in candidates:
        if not Path(path).is_file():
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r"release (\d+\.\d+)", out)
        if match:
            return path, match.group(1)
    return None


def sglang_decisions(timeout: float = 300) -> dict[str, Any]:
    """Run ``decide`` in a fresh interpreter (SGLang's imports stay out of this one)."""
    try:
        done = subprocess.run([sys.executable, "-m", f"{__package__}.decide"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout:.0f}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("SM120FORK-DECIDE "):
            result: dict[str, Any] = json.loads(line.removeprefix("SM120FORK-DECIDE "))
            return result
    return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}


@dataclass(frozen=True, kw_only=True)
class Probes:
    gpus: Callable[[], GpuFacts] = query_gpus
    runtime: Callable[[], str | None] = cuda_runtime
    peer_writes: Callable[[Sequence[int]], list[PairResult]] = ipc_probe
    installed: Callable[[str], str | None] = installed
    package_dir: Callable[[str], Path | None] = package_dir
    plugin: Callable[[], list[dict[str, str]] | str] = plugin_report
    nvcc: Callable[[], tuple[str, str] | None] = nvcc_version
    decisions: Callable[[], dict[str, Any]] = sglang_decisions
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    home: Path = field(default_factory=Path.home)


# --- the report ----------------------------------------------------------------------------

@dataclass
class Report:
    sections: dict[str, Any] = field(default_factory=dict)
    lines: list[tuple[str, str]] = field(default_factory=list)   # (section, text)
    blockers: list[str] = field(default_factory=list)

    def say(self, section: str, text: str) -> None:
        self.lines.append((section, text))

    def block(self, text: str) -> None:
        self.blockers.append(text)

    def to_json(self) -> dict[str, Any]:
        return {**self.sections, "blockers": self.blockers,
                "ok": not self.blockers}


def _is_ours(version: str | None) -> bool:
    return version is not None and f"+{OUR_LABEL}" in version


def _sm12x(devices: Sequence[Device]) -> bool:
    return any(d.capability[0] == 12 for d in devices)


def check_gpus(report: Report, probes: Probes) -> GpuFacts:
    facts = probes.gpus()
    runtime = probes.runtime()
    report.sections["gpus"] = {
        "driver": facts.driver, "cuda_runtime": runtime,
        "devices": [{"index": d.index, "name": d.name,
                     "capability": f"{d.capability[0]}.{d.capability[1]}",
                     "multicast": d.multicast} for d in facts.devices],
        "p2p": [list(row) for row in facts.p2p], "error": facts.error}
    if facts.error:
        report.block(f"GPUs: {facts.error} (install the NVIDIA driver; run on the GPU box)")
        return facts
    shown = runtime or "unknown (torch not installed)"
    report.say("gpus", f"driver CUDA {facts.driver}, runtime CUDA {shown}")
    for d in facts.devices:
        mc = {True: "yes", False: "no", None: "unknown"}[d.multicast]
        report.say("gpus", f"GPU {d.index}: {d.name}, compute capability "
                           f"{d.capability[0]}.{d.capability[1]}, multicast {mc}")
    if not facts.devices:
        report.block("GPUs: the driver reports no GPU (check CUDA_VISIBLE_DEVICES)")
    n = len(facts.devices)
    if n > 1:
        report.say("gpus", "P2P access (row can access column): " + "; ".join(
            f"{a}: " + " ".join("yes" if facts.p2p[a][b] else "no" for b in range(n))
            for a in range(n)))
        for a in range(n):
            for b in range(n):
                if a != b and not facts.p2p[a][b]:
                    report.block(f"P2P: GPU {a} cannot access GPU {b}; the fused all-reduce "
                                 "needs P2P (GeForce drivers block it; check the BIOS/ACS "
                                 "and NCCL_P2P_DISABLE) and fails closed without it")
    if any(d.multicast is False for d in facts.devices):
        report.say("gpus", "no multicast: only FlashInfer's trtllm backend (CUDA IPC) "
                           "can run here, which is what our SGLang asks for")
    return facts


def check_peer_writes(report: Report, probes: Probes, facts: GpuFacts) -> None:
    n = len(facts.devices)
    if facts.error or n == 0:
        return
    devices = [0, 0] if n == 1 else list(range(n))
    if n == 1:
        report.say("peer writes", "one GPU: testing CUDA IPC between two processes on GPU 0")
    results = probes.peer_writes(devices)
    report.sections["peer_writes"] = [r.to_json() for r in results]
    for r in results:
        pair = (f"process {r.writer} -> process {r.owner} on GPU {r.owner_gpu}" if n == 1
                else f"GPU {r.writer_gpu} -> GPU {r.owner_gpu}")
        report.say("peer writes", f"{pair}: {'ok' if r.ok else 'FAILED'}: {r.detail}")
        if not r.ok:
            report.block(f"peer writes: {pair} did not arrive ({r.detail}); the fused "
                         "kernel would hang or compute garbage here: check IOMMU/ACS "
                         "settings, or keep fusion off")


def check_packages(report: Report, probes: Probes, facts: GpuFacts) -> None:
    sglang = probes.installed("sglang")
    flashinfer = probes.installed("flashinfer-python")
    plugin = probes.installed(PLUGIN_DISTRIBUTION)
    sm12x = _sm12x(facts.devices)
    info: dict[str, Any] = {"sglang": sglang, "flashinfer": flashinfer, "plugin": plugin}
    report.sections["packages"] = info

    def kind(version: str | None, sibling: str | None) -> str:
        if version is None:
            return "not installed"
        if _is_ours(version):
            return "ours"
        if _is_ours(sibling):  # our pair was installed, then one of them replaced
            return "stock, installed over ours"
        return "stock"

    sglang_kind = kind(sglang, flashinfer)
    info["sglang_kind"], info["flashinfer_kind"] = sglang_kind, kind(flashinfer, sglang)
    report.say("packages", f"sglang {sglang or '-'} ({sglang_kind}); flashinfer-python "
                           f"{flashinfer or '-'} ({info['flashinfer_kind']})")
    hooks = probes.plugin() if plugin is not None else None
    info["plugin_hooks"] = hooks
    active = False
    if plugin is not None:
        if isinstance(hooks, str):
            report.block(f"plugin: {PLUGIN_DISTRIBUTION} {plugin} is installed but cannot "
                         f"run: {hooks} (reinstall it)")
        else:
            assert hooks is not None
            bad = [h for h in hooks if h["state"] == "not applied"]
            active = not bad and any(h["state"] == "applied" for h in hooks)
            report.say("packages", f"plugin {PLUGIN_DISTRIBUTION} {plugin}: "
                                   + ("active" if active else "inactive"))
            for h in hooks:
                why = f" ({h['why']})" if h["why"] else ""
                report.say("packages", f"  {h['hook']}: {h['state']}{why}")
            if bad and sglang_kind != "ours":
                report.block(f"plugin: {len(bad)} hook(s) cannot apply to sglang {sglang} "
                             f"(first: {bad[0]['hook']}: {bad[0]['why']}); install the "
                             "plugin wheel built for this SGLang, or our patched wheels")
    whitelist = probes.environ.get("SGLANG_PLUGINS")
    if plugin is not None and whitelist and PLUGIN_ENTRY_POINT not in {
            x.strip() for x in whitelist.split(",")}:
        active = False
        report.block(f"plugin: SGLANG_PLUGINS={whitelist} does not list "
                     f"'{PLUGIN_ENTRY_POINT}', so SGLang never loads it")
    if probes.environ.get("SM120FORK_PLUGIN", "").strip().lower() in ("0", "off", "false", "no"):
        active = False
    info["plugin_active"] = active
    if not sm12x:
        return
    if sglang is None:
        report.block("sglang: not installed (install our patched wheels, or stock SGLang "
                     "plus the plugin wheel)")
    elif sglang_kind != "ours" and not active:
        how = ("pip install -U sglang replaced our patched build" if "over ours" in sglang_kind
               else f"stock sglang {sglang} refuses SM12x for the fused all-reduce")
        report.block(f"sglang: {how}: install the plugin wheel for this SGLang "
                     f"(wheels/<stack>/{PLUGIN_DISTRIBUTION.replace('-', '_')}-*.whl) or our "
                     "patched wheels with pip install -c wheels/<stack>/constraints.txt")


def _prebuilt(probes: Probes, flashinfer: str) -> list[Path]:
    roots = []
    for package in ("flashinfer_jit_cache", "flashinfer"):
        found = probes.package_dir(package)
        if found is not None:
            roots.append(found if package == "flashinfer_jit_cache" else found / "data" / "aot")
    base = probes.environ.get("FLASHINFER_WORKSPACE_BASE")
    public = flashinfer.split("+", maxsplit=1)[0]
    cache = (Path(base) if base else probes.home) / ".cache" / "flashinfer" / public
    roots.append(cache)
    hits: list[Path] = []
    for root in roots:
        if root.is_dir():
            hits += sorted(root.rglob(f"{COMM_MODULE}*.so"))
    return hits


def _jit_majors(probes: Probes) -> list[int] | None:
    """The majors this FlashInfer's JIT builds the comm module for (None: unreadable)."""
    found = probes.package_dir("flashinfer")
    source = found / "jit" / "comm.py" if found else None
    try:
        text = source.read_text(encoding="utf-8") if source else ""
    except OSError:
        return None
    body = text.partition("def gen_trtllm_comm_module")[2].partition("\ndef ")[0]
    match = re.search(r"supported_major_versions\s*=\s*\[([\d,\s]*)\]", body)
    return [int(x) for x in match.group(1).split(",") if x.strip()] if match else None


def _nvcc_can_jit(version: str, major: int) -> bool:
    need = {12: (12, 9), 10: (12, 8), 9: (12, 0)}.get(major, (12, 0))
    have = tuple(int(x) for x in version.split(".")[:2])
    return have >= need


def check_comm_module(report: Report, probes: Probes, facts: GpuFacts) -> None:
    flashinfer = probes.installed("flashinfer-python")
    section: dict[str, Any] = {"prebuilt": [], "nvcc": None, "jit_majors": None}
    report.sections["comm_module"] = section
    if flashinfer is None:
        report.say("comm module", "flashinfer-python not installed: nothing to load")
        if _sm12x(facts.devices):
            report.block("flashinfer: not installed (the fused all-reduce is FlashInfer's)")
        return
    majors = sorted({d.capability[0] for d in facts.devices})
    prebuilt = _prebuilt(probes, flashinfer)
    section["prebuilt"] = [str(p) for p in prebuilt]
    nvcc = probes.nvcc()
    section["nvcc"] = None if nvcc is None else {"path": nvcc[0], "version": nvcc[1]}
    jit = _jit_majors(probes)
    section["jit_majors"] = jit
    if prebuilt:
        marker = [p for p in prebuilt if Path(f"{p}.sources").is_file()]
        report.say("comm module", f"prebuilt {COMM_MODULE} found: {prebuilt[0]}"
                   + (" (with sources digest)" if marker else ""))
        if _is_ours(flashinfer) and not marker:
            report.say("comm module", "our FlashInfer loads a prebuilt module only with "
                                      "its sources digest beside it; this one will be "
                                      "JIT-compiled instead")
        else:
            return
    for major in majors:
        jit_ok = jit is None or major in jit
        if not jit_ok:
            report.block(f"comm module: flashinfer-python {flashinfer}'s JIT refuses compute "
                         f"capability {major}.x (it builds {jit}); install our FlashInfer or "
                         "0.6.17 or newer")
        elif nvcc is None:
            if not prebuilt:
                report.block(f"comm module: no prebuilt {COMM_MODULE} and no nvcc: install the "
                             "AOT wheel of our comm module, or a CUDA toolkit >= 12.9 "
                             "(CUDA_HOME) so FlashInfer can JIT it (~3 min once)")
        elif not _nvcc_can_jit(nvcc[1], major):
            report.block(f"comm module: nvcc {nvcc[1]} cannot JIT for compute capability "
                         f"{major}.x (needs >= 12.9 for 12.x); install a newer CUDA toolkit "
                         "or the AOT wheel")
        else:
            report.say("comm module", f"no prebuilt {COMM_MODULE}; nvcc {nvcc[1]} "
                                      f"({nvcc[0]}) can JIT it for {major}.x on first use")


def check_decisions(report: Report, probes: Probes, facts: GpuFacts) -> None:
    env = {k: probes.environ[k] for k in OVERRIDES if k in probes.environ}
    report.sections["environment"] = env
    report.say("environment", "overrides in force: " + (
        ", ".join(f"{k}={v}" for k, v in env.items()) if env else "none"))
    if probes.installed("sglang") is None or facts.error or not facts.devices:
        report.sections["decisions"] = None
        return
    result = probes.decisions()
    report.sections["decisions"] = result
    if "error" in result:
        report.say("decisions", f"not evaluated: {result['error']}")
        return
    for d in result["decisions"]:
        state = {True: "on", False: "off", None: "error"}[d["fusion"]]
        report.say("decisions", f"--tp {d['tp']} ({result['model']}): fusion {state}: "
                                f"{d['line']}")


def examine(probes: Probes | None = None) -> Report:
    probes = probes or Probes()
    report = Report()
    facts = check_gpus(report, probes)
    check_peer_writes(report, probes, facts)
    check_packages(report, probes, facts)
    check_comm_module(report, probes, facts)
    check_decisions(report, probes, facts)
    return report
