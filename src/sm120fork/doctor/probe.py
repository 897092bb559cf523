"""The doctor's probing: every fact it needs about this box (nothing here judges).

Everything that touches the machine goes through ``Probes``, so tests can replace one
probe; the FlashInfer and SGLang questions run in child interpreters.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from ..cuda.toolkit import locate_nvcc
from ..errors import CommandError
from ..gpu import policy as allreduce_policy
from ..util import proc, wire
from .cuda import CudaError, Driver
from .facts import SCHEMA, Decisions, Facts, FlashInfer, Gpus, Modules, Nvcc, Plugin, Torch
from .ipc import LinkResult
from .ipc import probe as ipc_probe

PLUGIN_DISTRIBUTION = "sm120fork-sglang-plugin"
PLUGIN_PACKAGE = "sm120fork_sglang_plugin"
AOT_DISTRIBUTION = "sm120fork-flashinfer-aot"
DISTRIBUTIONS = ("sglang", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache",
                 AOT_DISTRIBUTION, "torch", PLUGIN_DISTRIBUTION, "sm120fork")

#: Environment variables that change what SGLang/FlashInfer/NCCL do with the fused path.
OVERRIDES = (
    "SGLANG_SM120_FLASHINFER_ALLREDUCE_FUSION_AUTO", "SGLANG_SM120_FLASHINFER_PLAIN_ALLREDUCE",
    allreduce_policy.ENV_VAR,
    "SM120FORK_PLUGIN", "SGLANG_PLUGINS", "SGLANG_PLATFORM", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
    "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_DISABLE_VERSION_CHECK",
    "FLASHINFER_DISABLE_JIT", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
)


def tp_sizes(gpus: int) -> list[int]:
    """The TP sizes a box of ``gpus`` GPUs can run (powers of two from 2)."""
    return [2 ** k for k in range(1, 5) if 2 ** k <= gpus]


def numa_node(pci_bus_id: str | None) -> int | None:
    if not pci_bus_id:
        return None
    try:
        value = int(Path(f"/sys/bus/pci/devices/{pci_bus_id.lower()}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return None if value < 0 else value


def query_gpus() -> Gpus:
    """Driver, devices (in the order CUDA and so SGLang number them), P2P matrix."""
    try:
        drv = Driver()
        version = drv.version()
        devices = [drv.device(i) for i in range(drv.count())]
        p2p = [[a == b or drv.can_access_peer(a, b) for b in range(len(devices))]
               for a in range(len(devices))]
    except CudaError as exc:
        return {"driver": None, "devices": [], "p2p": [], "error": str(exc)}
    for d in devices:
        d["numa_node"] = numa_node(d.get("pci_bus_id"))
    return {"driver": f"{version // 1000}.{version % 1000 // 10}", "error": None,
            "devices": devices, "p2p": p2p}


def torch_facts() -> Torch | None:
    """torch's version and CUDA from its ``version.py``, without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")
    except OSError as exc:
        return {"version": None, "cuda": None, "error": str(exc)}
    def field_of(name: str) -> str | None:
        match = re.search(rf"^{name}\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)",
                          text, re.MULTILINE)
        return (match.group(1) or match.group(2)) if match else None
    return {"version": field_of("__version__"), "cuda": field_of("cuda")}


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def requirements(distribution: str) -> list[str]:
    """``Requires-Dist`` of an installed distribution (empty if not installed)."""
    try:
        return list(importlib.metadata.requires(distribution) or [])
    except importlib.metadata.PackageNotFoundError:
        return []


def has_plugin_framework() -> bool | None:
    """Whether the installed SGLang has ``sglang.srt.plugins`` (0.5.11+), read from its
    files without importing SGLang; None without SGLang."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return any((Path(p) / "srt" / "plugins" / "__init__.py").is_file()
               for p in spec.submodule_search_locations)


def plugin_report() -> Plugin:
    """Our plugin's per-hook verdict for the installed SGLang (without applying anything)."""
    try:
        plugin = importlib.import_module(PLUGIN_PACKAGE)
        runtime = importlib.import_module(f"{PLUGIN_PACKAGE}.plugin.runtime")
        return {"hooks": [s.to_json() for s in runtime.evaluate(plugin.spec())],
                "stack": getattr(plugin, "STACK", None)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def nvcc_version() -> Nvcc | None:
    """The nvcc FlashInfer's JIT would use (the toolkit's one locator, in its order)."""
    found = locate_nvcc()
    return None if found is None else {"path": str(found.path), "version": found.version,
                                       "found_in": found.found_in}


def _child_json(module: str, args: Sequence[str], tag: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` and read its one ``tag`` message (the one wire)."""
    try:
        done = proc.run([sys.executable, "-m", module, *args], check=False, timeout=timeout,
                        quiet=True)
    except CommandError as exc:
        return {"error": f"no answer within {timeout:.0f}s" if exc.timed_out else exc.what}
    try:
        result: Any = wire.last(done.stdout, tag)
    except wire.WireError as exc:
        return {"error": f"{module} spoke another wire format: {exc.what}"}
    if isinstance(result, dict):
        return result
    return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}


def flashinfer_facts(capabilities: Sequence[str], timeout: float = 300) -> FlashInfer:
    from .flashinfer_probe import TAG
    result = _child_json(f"{__package__}.flashinfer_probe", list(capabilities), TAG, timeout)
    if "error" in result and len(result) == 1:
        return {"probe_error": result["error"]}
    return cast(FlashInfer, result)


def sglang_decisions(sizes: Sequence[int], timeout: float = 300) -> Decisions:
    from .decide import TAG
    return cast(Decisions, _child_json(f"{__package__}.decide", [str(t) for t in sizes], TAG,
                                       timeout))


def importable_names(timeout: float = 300) -> Modules:
    """Which names the all-reduce methods need import in this interpreter (asked in a
    child: importing FlashInfer here would load CUDA into the doctor)."""
    from ..gpu.decision import needed_names
    names = needed_names()
    module = f"{__package__.rpartition('.')[0]}.gpu.decision"
    return cast(Modules, {"asked": names, **_child_json(module, names, "IMPORTABLE", timeout)})


def topology() -> str | None:
    """``nvidia-smi topo -m`` (PCIe switches, host bridges, NUMA affinity), if present."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = proc.run([smi, "topo", "-m"], check=False, timeout=30, quiet=True)
    except (OSError, CommandError):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True, kw_only=True)
class Probes:
    gpus: Callable[[], Gpus] = query_gpus
    torch: Callable[[], Torch | None] = torch_facts
    peers: Callable[[Sequence[int]], list[LinkResult]] = ipc_probe
    installed: Callable[[str], str | None] = installed
    requirements: Callable[[str], list[str]] = requirements
    plugin: Callable[[], Plugin] = plugin_report
    plugin_framework: Callable[[], bool | None] = has_plugin_framework
    nvcc: Callable[[], Nvcc | None] = nvcc_version
    flashinfer: Callable[[Sequence[str]], FlashInfer] = flashinfer_facts
    decisions: Callable[[Sequence[int]], Decisions] = sglang_decisions
    topology: Callable[[], str | None] = topology
    policy: Callable[[Mapping[str, str]], dict[str, Any]] = allreduce_policy.read_for_doctor
    modules: Callable[[], Modules] = importable_names
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def collect(probes: Probes | None = None, extra_tp: Sequence[int] = ()) -> Facts:
    """Every fact the rules read, probed on this box."""
    probes = probes or Probes()
    gpus = probes.gpus()
    packages = {d: probes.installed(d) for d in DISTRIBUTIONS}
    facts: Facts = {
        "schema": SCHEMA,
        "made_by": {"doctor": packages["sm120fork"] or packages[PLUGIN_DISTRIBUTION],
                    "python": platform.python_version(), "machine": platform.machine(),
                    "executable": sys.executable},
        "environ": {k: probes.environ[k] for k in OVERRIDES if k in probes.environ},
        "skipped": {},
        "gpus": gpus,
        "topology": probes.topology() if gpus["devices"] else None,
        "torch": probes.torch(),
        "nvcc": probes.nvcc(),
        "packages": packages,
        "requires": {"sglang": [r for r in probes.requirements("sglang")
                                if r.lower().replace("_", "-").startswith("flashinfer")]},
        "plugin": probes.plugin() if packages[PLUGIN_DISTRIBUTION] else None,
        "sglang_plugin_framework": probes.plugin_framework(),
        "policy": probes.policy(probes.environ),
        "modules": probes.modules(),
    }

    def skip(fact: Literal["peers", "flashinfer", "decisions"], why: str) -> None:
        facts[fact] = None
        facts["skipped"][fact] = why

    n = len(gpus["devices"])
    if n == 0:
        skip("peers", "no GPU visible" + (f" ({gpus['error']})" if gpus.get("error") else ""))
    else:
        devices = [0, 0] if n == 1 else list(range(n))
        facts["peers"] = {"processes_on_one_gpu": n == 1,
                          "links": [r.to_json() for r in probes.peers(devices)]}
    if packages["flashinfer-python"] is None:
        skip("flashinfer", "flashinfer-python is not installed")
    elif n == 0:
        skip("flashinfer", "no GPU visible: FlashInfer picks its architectures from the GPUs "
                           "torch sees")
    else:
        capabilities = sorted({d["capability"] for d in gpus["devices"]})
        facts["flashinfer"] = probes.flashinfer(capabilities)
    # The sizes the box fits, and every --tp asked for even where it does not fit: SGLang's
    # decision code reads the platform, not the GPU count, so on a one-GPU box where a
    # policy was made with ranks sharing the GPU, --tp 2 still shows what SGLang decides.
    sizes = sorted(set(tp_sizes(n)) | {t for t in extra_tp if t > 1})
    if packages["sglang"] is None:
        skip("decisions", "sglang is not installed")
    elif n == 0:
        skip("decisions", "no GPU visible: SGLang's --tp decisions read the platform of a GPU")
    elif not sizes:
        skip("decisions", f"{n} GPU: no --tp above 1 fits on this box")
    else:
        facts["decisions"] = probes.decisions(sizes)
    return facts


def portable(facts: Facts, home: Path | None = None) -> Facts:
    """The facts with this machine's package folders (site-packages, PYTHONPATH) and home
    folder replaced by their role (``<site-packages>``, ``~``), so a record can be sent,
    committed and re-judged elsewhere."""
    roles = [(sysconfig.get_paths()[k], "<site-packages>") for k in ("purelib", "platlib")]
    roles += [(p, "<site-packages>") for p in sys.path if p.endswith(("site-packages",
                                                                      "dist-packages"))]
    # folders on PYTHONPATH hold installed packages too (pip install --target)
    for p in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        roles += [(str(Path(p).resolve()), "<site-packages>"), (p, "<site-packages>")]
    roles.append((str(home or Path.home()), "~"))
    text = json.dumps(facts)
    for path, role in sorted(roles, key=lambda x: -len(x[0])):
        if len(path) > 1:
            text = text.replace(json.dumps(path)[1:-1], role)
    return cast(Facts, json.loads(text))
