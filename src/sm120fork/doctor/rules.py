"""The doctor's judging: pure rules over facts, probed or recorded (nothing asks the machine)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..gpu import decision
from ..gpu import policy as allreduce_policy
from .facts import Comm, Device, Facts, FlashInfer, Hook, Link, Provenance
from .probe import AOT_DISTRIBUTION, PLUGIN_DISTRIBUTION, tp_sizes

PLUGIN_ENTRY_POINT = "sm120fork"
OUR_LABEL = "sm120"
COMM_MODULE = "trtllm_comm"
#: A peer write this much slower than the pair's reads is the collapse seen on some
#: PCIe root complexes (2.6 GB/s writes vs 52 GB/s reads on a 16x RTX PRO 6000 box).
WRITE_COLLAPSE = 0.25
PLUGIN_WHEEL = "wheels/<stack>/plugin/sm120fork_sglang_plugin-*.whl"
INSTALL_WHEELS = "pip install -c wheels/<stack>/constraints.txt wheels/<stack>/*.whl"


@dataclass
class Report:
    sections: dict[str, Any] = field(default_factory=dict)
    lines: list[tuple[str, str]] = field(default_factory=list)   # (section, text)
    blockers: list[str] = field(default_factory=list)

    def writer(self, section: str) -> Callable[[str], None]:
        """How a rule says a line of its ``section``."""
        return lambda text: self.lines.append((section, text))

    def block(self, text: str) -> None:
        self.blockers.append(text)

    def examined(self, facts: Facts, why: str) -> None:
        """The first line: which Python was examined, and why that one."""
        self.sections["python"] = {"path": _python(facts), "why": why}

    def text_of(self, section: str) -> list[str]:
        return [t for s, t in self.lines if s == section]

    def to_json(self) -> dict[str, Any]:
        order = list(dict.fromkeys(s for s, _ in self.lines))
        return {**self.sections, "text": {s: self.text_of(s) for s in order},
                "blockers": self.blockers, "ok": not self.blockers}


def _python(facts: Facts) -> str:
    return facts.get("made_by", {}).get("executable") or "the Python the record does not name"


def _is_ours(version: str | None) -> bool:
    return version is not None and f"+{OUR_LABEL}" in version


def _major(device: Device) -> int:
    return int(str(device["capability"]).split(".")[0])


def _sm12x(facts: Facts) -> bool:
    return any(_major(d) == 12 for d in facts["gpus"]["devices"])


def _span(gpus: Sequence[int]) -> str:
    ordered = sorted(gpus)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"GPUs {ordered[0]}-{ordered[-1]}"
    return "GPUs " + ",".join(map(str, ordered))


def judge_gpus(report: Report, facts: Facts) -> bool:
    gpus = facts["gpus"]
    torch = facts.get("torch") or {}
    report.sections["gpus"] = gpus
    say = report.writer("gpus")
    if gpus.get("error"):
        say(f"no GPU: {gpus['error']}")
        report.block(f"GPUs: {gpus['error']} (install the NVIDIA driver; run on the GPU box)")
        return False
    shown = torch.get("cuda") or ("none (torch is a CPU build)" if torch else
                                  "unknown (torch not installed)")
    say(f"driver CUDA {gpus['driver']}, torch CUDA {shown}")
    env = facts["environ"]
    ordering = [f"{k}={env[k]}" for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER") if k in env]
    if ordering:
        say("GPU numbers are CUDA's, as SGLang numbers them: after " + ", ".join(ordering))
    for d in gpus["devices"]:
        mc = {True: "yes", False: "no", None: "unknown"}[d.get("multicast")]
        where = ""
        if d.get("pci_bus_id"):
            numa = d.get("numa_node")
            where = f", PCI {d['pci_bus_id']}" + ("" if numa is None else f", NUMA node {numa}")
        say(f"GPU {d['index']}: {d['name']}, compute capability {d['capability']}, "
            f"multicast {mc}{where}")
    if not gpus["devices"]:
        say("the driver reports no GPU")
        report.block("GPUs: the driver reports no GPU (check CUDA_VISIBLE_DEVICES)")
        return False
    n = len(gpus["devices"])
    if n > 1:
        p2p = gpus["p2p"]
        say("P2P access (row can access column): " + "; ".join(
            f"{a}: " + " ".join("yes" if p2p[a][b] else "no" for b in range(n))
            for a in range(n)))
    if any(d.get("multicast") is False for d in gpus["devices"]):
        say("no multicast: only FlashInfer's trtllm backend (CUDA IPC / VMM unicast) can run "
            "here, which is what our SGLang asks for")
    return True


def judge_peers(report: Report, facts: Facts) -> None:
    peers = facts.get("peers")
    report.sections["peers"] = peers
    say = report.writer("peers")
    if peers is None:
        say(f"skipped: {facts['skipped'].get('peers', 'not probed')}")
        return
    one = peers["processes_on_one_gpu"]
    if one:
        say("one GPU: testing memory sharing between two processes on GPU 0 (bandwidth there "
            "is the GPU's own memory, not a peer link)")
    for link in peers["links"]:
        pair = (f"process {link['writer']} -> process {link['owner']} on GPU "
                f"{link['owner_gpu']}" if one
                else f"GPU {link['writer_gpu']} -> GPU {link['owner_gpu']}")
        state = "ok" if link["ok"] else "FAILED"
        w, r = link.get("write_gbps"), link.get("read_gbps")
        speed = "" if w is None or r is None else f", write {w:.1f} GB/s, read {r:.1f} GB/s"
        say(f"{pair}: {state}: {link['detail']}{speed}")
    if one:
        bad = [x for x in peers["links"] if not x["ok"]]
        if bad:   # --tp 1 shares nothing, so not a blocker on this box
            say(f"warning: {bad[0]['detail']} between two processes on one GPU: the fused "
                "all-reduce's workspace shares memory this way, so a multi-GPU box with this "
                "driver/container would fail too (check the container's IPC limits: "
                "SCM_RIGHTS, /dev/shm)")


def _links(facts: Facts) -> dict[tuple[int, int], Link]:
    peers = facts.get("peers")
    if not peers or peers["processes_on_one_gpu"]:
        return {}
    return {(x["writer_gpu"], x["owner_gpu"]): x for x in peers["links"]}


@dataclass(frozen=True)
class Verdict:
    tp: int
    gpus: tuple[int, ...]
    ok: bool
    why: str
    warning: str = ""


def _window(facts: Facts, gpus: Sequence[int]) -> tuple[bool, str, str]:
    """(ok, why, warning) of the fused all-reduce on exactly these GPUs."""
    p2p = facts["gpus"]["p2p"]
    links = _links(facts)
    ordered = [(a, b) for a in gpus for b in gpus if a != b]
    for a, b in ordered:
        if not p2p[a][b]:
            return False, f"GPU {a} cannot access GPU {b} (no P2P)", ""
    for a, b in ordered:
        link = links.get((a, b))
        if link is None:
            return False, f"GPU {a} -> GPU {b} was not probed", ""
        if not link["ok"]:
            return False, f"GPU {a} -> GPU {b}: {link['detail']}", ""
    pairs = [links[p] for p in ordered]
    reads = [r for x in pairs if (r := x.get("read_gbps"))]
    warning = ""
    if reads:
        typical = statistics.median(reads)
        slow = [(w, x) for x in pairs if (w := x.get("write_gbps")) is not None
                and w < WRITE_COLLAPSE * typical]
        if slow:
            least, worst = min(slow, key=lambda wx: wx[0])
            warning = (f"peer writes collapse: GPU {worst['writer_gpu']} -> GPU "
                       f"{worst['owner_gpu']} writes {least:.1f} GB/s against "
                       f"{typical:.1f} GB/s reads; the lamport one-shot kernel pushes to every "
                       "peer, so measure before enabling fusion at this size")
    numa = {facts["gpus"]["devices"][g].get("numa_node") for g in gpus}
    where = (f"one socket: NUMA node {numa.pop()}" if len(numa) == 1 and None not in numa
             else "across NUMA nodes " + ",".join(str(x) for x in sorted(
                 n for n in numa if n is not None)) if None not in numa else "")
    return True, where, warning


def tp_verdicts(facts: Facts, base: int = 0,
                requested: Sequence[int] = ()) -> list[Verdict]:
    """One verdict per TP size, on the GPUs SGLang would use: ``base`` .. ``base+tp-1``
    in CUDA's (visible-device) order; where those fail, the first other base that works."""
    n = len(facts["gpus"]["devices"])
    verdicts = []
    for tp in sorted(set(tp_sizes(n)) | set(requested)):
        gpus = tuple(range(base, base + tp))
        if base + tp > n:
            verdicts.append(Verdict(tp, gpus, False,
                                    f"needs GPUs {base}-{base + tp - 1}, this box shows {n}"))
            continue
        ok, why, warning = _window(facts, gpus)
        if not ok:
            for other in range(n - tp + 1):
                if other != base and _window(facts, range(other, other + tp))[0]:
                    why += (f"; ok with --base-gpu-id {other} "
                            f"({_span(range(other, other + tp))})")
                    break
        verdicts.append(Verdict(tp, gpus, ok, why, warning))
    return verdicts


def judge_tp(report: Report, facts: Facts, base: int,
             requested: Sequence[int]) -> list[Verdict]:
    n = len(facts["gpus"]["devices"])
    if n == 0:
        return []
    say = report.writer("tp")
    if n == 1 and not requested:
        say("one GPU: --tp 1 only; the fused all-reduce needs --tp 2 or more")
        report.sections["tp"] = []
        return []
    verdicts = tp_verdicts(facts, base, requested)
    report.sections["tp"] = [asdict(v) for v in verdicts]
    for v in verdicts:
        if v.ok:
            where = f" ({v.why})" if v.why else ""
            warning = f"; warning: {v.warning}" if v.warning else ""
            say(f"--tp {v.tp} ok on {_span(v.gpus)}{where}{warning}")
        else:
            say(f"--tp {v.tp} NOT on {_span(v.gpus)}: {v.why}")
    if not _sm12x(facts):
        return verdicts
    for v in verdicts:
        if v.tp in requested and not v.ok:
            report.block(f"--tp {v.tp}: the fused all-reduce cannot run on {_span(v.gpus)}: "
                         f"{v.why} (SGLang fails closed to the unfused all-reduce)")
    if not requested and verdicts and not any(v.ok for v in verdicts):
        first = verdicts[0]
        report.block(f"no --tp size can use the fused all-reduce here: --tp {first.tp} on "
                     f"{_span(first.gpus)}: {first.why} (check the BIOS/ACS/IOMMU and "
                     "NCCL_P2P_DISABLE; GeForce drivers block P2P)")
    return verdicts


def _pins_ours(requires: Sequence[str]) -> bool:
    return any(r.lower().replace("_", "-").startswith("flashinfer-python")
               and f"+{OUR_LABEL}" in r for r in requires)


def _kinds(packages: dict[str, str | None], requires: Sequence[str]) -> tuple[str, str]:
    """Whose sglang and flashinfer-python these are: ours, stock, or stock over ours."""
    sglang, flashinfer = packages.get("sglang"), packages.get("flashinfer-python")
    if sglang is None:
        sglang_kind = "not installed"
    elif _is_ours(sglang):
        sglang_kind = "ours"
    elif _is_ours(flashinfer):
        sglang_kind = "stock, installed over ours"
    else:
        sglang_kind = "stock"
    if flashinfer is None:
        fi_kind = "not installed"
    elif _is_ours(flashinfer):
        fi_kind = "ours"
    elif _is_ours(sglang) and _pins_ours(requires):
        fi_kind = "stock, installed over ours"
    elif _is_ours(sglang) or packages.get(PLUGIN_DISTRIBUTION):
        fi_kind = "as published: this stack uses it unpatched"
    else:
        fi_kind = "stock"
    return sglang_kind, fi_kind


def _plugin_state(report: Report, facts: Facts, sglang_kind: str) -> tuple[bool, str, list[Hook]]:
    """(active, state, hooks) of our installed plugin, and its blockers."""
    env, plugin_facts = facts["environ"], facts.get("plugin")
    sglang, plugin = facts["packages"].get("sglang"), facts["packages"].get(PLUGIN_DISTRIBUTION)
    if sglang is None:
        return False, "off: it has no SGLang to apply to", []
    if not plugin_facts or "error" in plugin_facts:
        why = (plugin_facts or {}).get("error", "not probed")
        report.block(f"plugin: {PLUGIN_DISTRIBUTION} {plugin} is installed but cannot "
                     f"run: {why} (reinstall it)")
        return False, f"broken: {why}", []
    hooks = plugin_facts["hooks"]
    bad = [h for h in hooks if h["state"] == "not applied"]
    whitelist = env.get("SGLANG_PLUGINS")
    if env.get("SM120FORK_PLUGIN", "").strip().lower() in ("0", "off", "false", "no"):
        return False, f"off: SM120FORK_PLUGIN={env['SM120FORK_PLUGIN']} disables it", hooks
    if whitelist and PLUGIN_ENTRY_POINT not in {x.strip() for x in whitelist.split(",")}:
        unlisted = (f"SGLANG_PLUGINS={whitelist} does not list '{PLUGIN_ENTRY_POINT}', so "
                    "SGLang never loads it")
        report.block(f"plugin: {unlisted} (add it)")
        return False, f"off: {unlisted}", hooks
    if bad:
        if sglang_kind != "ours":
            report.block(f"plugin: {len(bad)} hook(s) cannot apply to sglang {sglang} "
                         f"(first: {bad[0]['hook']}: {bad[0]['why']}); install the "
                         f"plugin wheel built for this SGLang ({PLUGIN_WHEEL})")
        return False, f"off: {len(bad)} hook(s) cannot apply, so none is applied", hooks
    if any(h["state"] == "applied" for h in hooks):
        return True, "active: SGLang's load_plugins() applies its hooks", hooks
    return False, "off: no hook applies to this SGLang", hooks


def judge_packages(report: Report, facts: Facts) -> tuple[str, bool]:
    """(whose SGLang this is, whether our plugin is active), and what the text says."""
    packages = facts["packages"]
    sglang, flashinfer = packages.get("sglang"), packages.get("flashinfer-python")
    plugin = packages.get(PLUGIN_DISTRIBUTION)
    requires = facts.get("requires", {}).get("sglang", [])
    sglang_kind, fi_kind = _kinds(packages, requires)
    say = report.writer("packages")
    say(f"sglang {sglang or '-'} ({sglang_kind}); flashinfer-python {flashinfer or '-'} "
        f"({fi_kind})")
    if sglang is None:
        say(f"SGLang is not installed in {_python(facts)}")
    for extra in ("flashinfer-cubin", "flashinfer-jit-cache", AOT_DISTRIBUTION):
        if packages.get(extra):
            say(f"{extra} {packages[extra]}")
    plugin_facts = facts.get("plugin")
    active, state, hooks = False, None, list[Hook]()
    if plugin is not None:
        active, state, hooks = _plugin_state(report, facts, sglang_kind)
        say(f"plugin {PLUGIN_DISTRIBUTION} {plugin}: {state}")
        for h in hooks:
            if h.get("carried") and h["state"] != "not applied":
                continue  # an import or constant the replaced functions use
            why = f" ({h['why']})" if h["why"] else ""
            shown = h["state"]
            if shown == "applied":
                shown = "applies when SGLang loads plugins" if active else (
                    "would apply, but the plugin is off")
            say(f"  {h['hook']}: {shown}{why}")
    report.sections["packages"] = {
        **packages, "sglang_kind": sglang_kind, "flashinfer_kind": fi_kind,
        "plugin_state": state, "plugin_active": active,
        "plugin_hooks": hooks if plugin_facts and "hooks" in plugin_facts else (
            (plugin_facts or {}).get("error"))}
    if sglang is None:  # the plugin's version is SGLang's plus our local label
        install = (f"the SGLang its plugin {plugin} is for there: pip install sglang=="
                   f"{plugin.partition('+')[0]}" if plugin else
                   f"the stack's wheels there: {INSTALL_WHEELS}")
        report.block(f"SGLang is not installed in {_python(facts)} (give the doctor the "
                     f"Python SGLang serves from: --python /path/to/python; or install "
                     f"{install})")
    if not _sm12x(facts):
        return sglang_kind, active
    if sglang is not None and sglang_kind != "ours" and not active:
        how = ("pip install -U sglang replaced our patched build" if "over ours" in sglang_kind
               else f"stock sglang {sglang} refuses SM12x for the fused all-reduce")
        if facts.get("sglang_plugin_framework") is False:
            fix = (f"this SGLang has no plugin framework (sglang.srt.plugins, 0.5.11+), so "
                   f"install our patched wheels: {INSTALL_WHEELS}")
        else:
            fix = (f"install the plugin wheel for this SGLang ({PLUGIN_WHEEL}) or our "
                   f"patched wheels with {INSTALL_WHEELS}")
        report.block(f"sglang: {how}: {fix}")
    if fi_kind == "stock, installed over ours":
        report.block(f"flashinfer-python: {flashinfer} replaced our patched build that sglang "
                     f"{sglang} pins ({requires[0] if requires else 'its requirement'}): "
                     f"reinstall with {INSTALL_WHEELS}")
    return sglang_kind, active


def _version_dir(path: str) -> str | None:
    match = re.search(r"\.cache/flashinfer/([^/]+)/", path)
    return match.group(1) if match else None


def _jit_cache(fi: FlashInfer) -> str:
    if not fi.get("jit_cache_package"):
        return ""
    cache = fi.get("jit_cache")
    if not cache:
        return " (flashinfer-jit-cache)"
    return (f" (flashinfer-jit-cache {cache.get('version')}, built by "
            f"{cache.get('built_by') or 'upstream'})")


def _archs(report: Report, fi: FlashInfer, shown: str) -> bool:
    """What FlashInfer builds per compute capability; True where one is refused."""
    version, cuda, source = fi.get("version"), fi.get("cuda_version"), fi.get("cuda_from")
    say = report.writer("comm module")
    refused = False
    for cap, entry in sorted((fi.get("archs") or {}).items()):
        floor = entry.get("floor")
        if "error" not in entry:
            need = f"needs CUDA >= {floor}" if floor else "no CUDA floor of its own"
            say(f"compute capability {cap}: builds for compute_{entry.get('arch')} ({need})")
            continue
        refused = True
        say(f"compute capability {cap}: refused with CUDA {cuda}: {entry['error']} "
            f"(this FlashInfer needs >= {floor})")
        fix = (f"install a CUDA toolkit >= {floor} and point CUDA_HOME at it, or a torch "
               f"built for CUDA >= {floor}" if source == "torch" else
               f"install a CUDA toolkit >= {floor} (CUDA_HOME)")
        report.block(f"comm module: flashinfer {version} refuses compute capability {cap} "
                     f"with {shown}: it needs CUDA >= {floor}, and refuses before any "
                     f"prebuilt module is considered: {fix}")
    return refused


def _loads_prebuilt(report: Report, fi: FlashInfer, comm: Comm) -> bool:
    """Which prebuilt copy of the module FlashInfer loads, if any, and why not the others."""
    say = report.writer("comm module")
    for path in fi.get("other_caches", []):
        say(f"ignored: {path} (JIT cache of flashinfer {_version_dir(path) or 'another build'}; "
            f"this one looks only in {fi.get('jit_dir')})")
    for name, folder in fi.get("prebuilt_providers", []):
        say(f"prebuilt provider {name}: {folder}")
    # FlashInfer's own verdict on every prebuilt copy, in search order (our builds)
    for c in comm.get("copies", []):
        say(f"{COMM_MODULE}: prebuilt {c['path']}: "
            f"{'loads' if c['load'] else 'NOT loaded'}: {c['why']}")
    provenance: Provenance = comm.get("provenance") or {}
    if comm.get("is_aot") and ("copies" in comm or comm.get("aot_exists")):
        what = ("" if "copies" in comm else " (its sources digest matches)" if provenance
                else " (stock FlashInfer loads any prebuilt module)")
        report.sections["comm_module"]["loads_from"] = "prebuilt"
        say(f"{COMM_MODULE}: loads the prebuilt {comm['aot_path']}{what}")
        return True
    if "copies" in comm:
        if not comm["copies"]:
            say(f"{COMM_MODULE}: no prebuilt module in any folder it searches")
    elif comm.get("aot_exists"):
        why = provenance.get("mismatch") or "FlashInfer does not load it"
        say(f"{COMM_MODULE}: does NOT load the prebuilt {comm['aot_path']}: {why}")
        recorded, sources = provenance.get("recorded"), provenance.get("sources")
        if recorded and sources:
            say(f"  marker {recorded[:23]}..., sources recomputed {sources[:23]}...")
    else:
        say(f"{COMM_MODULE}: no prebuilt module at {comm.get('aot_path')}")
    return False


def judge_comm(report: Report, facts: Facts) -> None:
    fi = facts.get("flashinfer")
    section = report.sections["comm_module"] = {"facts": fi, "loads_from": None}
    say = report.writer("comm module")
    sm12x = bool(facts["gpus"]["devices"]) and _sm12x(facts)
    if fi is None:
        say(f"skipped: {facts['skipped'].get('flashinfer', 'not probed')}")
        if sm12x and facts["packages"].get("flashinfer-python") is None:
            report.block("flashinfer: not installed (the fused all-reduce is FlashInfer's)")
        return
    failure = fi.get("probe_error") or fi.get("import_error")
    if failure:
        say(f"FlashInfer could not be asked: {failure}")
        if sm12x:
            report.block(f"flashinfer: importing it fails ({failure}); SGLang fails the same "
                         "way (reinstall the stack's wheels with its constraints)")
        return
    version = fi.get("version")
    cuda, source = fi.get("cuda_version"), fi.get("cuda_from")
    shown = (f"CUDA {cuda} from nvcc ({fi.get('nvcc')})" if source == "nvcc"
             else f"CUDA {cuda} from torch (no nvcc found)")
    say(f"flashinfer {version} sees {shown}; prebuilt modules from {fi.get('aot_dir')}"
        f"{_jit_cache(fi)}; JIT cache {fi.get('jit_dir')}")
    refused = _archs(report, fi, shown)
    comm = fi.get("comm") or {}
    if "spec_error" in comm:
        say(f"{COMM_MODULE}: FlashInfer refuses the module: {comm['spec_error']}")
        if sm12x and not refused:
            report.block(f"comm module: flashinfer {version} refuses {COMM_MODULE} on this "
                         f"box: {comm['spec_error']} (install our FlashInfer, or 0.6.17 or "
                         "newer)")
        return
    if not comm or _loads_prebuilt(report, fi, comm):
        return
    if fi.get("disable_jit"):
        report.block(f"comm module: FLASHINFER_DISABLE_JIT is set and no loadable prebuilt "
                     f"{COMM_MODULE}: FlashInfer raises MissingJITCacheError (unset it, or "
                     "install the AOT wheel of our comm module)")
    elif source == "nvcc":
        section["loads_from"] = "jit"
        say(f"{COMM_MODULE}: JIT-compiled by nvcc {cuda} on first use (~3 min once) into "
            f"{comm.get('jit_path')}")
    elif comm.get("jit_exists"):
        section["loads_from"] = "jit cache"
        say(f"{COMM_MODULE}: a JIT-compiled module from an earlier run is at "
            f"{comm['jit_path']}; without nvcc FlashInfer loads it only while ninja finds "
            "it up to date")
    elif sm12x:
        floor = max((str(e.get("floor")) for e in (fi.get("archs") or {}).values()
                     if e.get("floor")), default="?")
        report.block(f"comm module: no loadable prebuilt {COMM_MODULE} and no nvcc: install "
                     "the AOT wheel of our comm module, or a CUDA toolkit >= "
                     f"{floor} (CUDA_HOME) so FlashInfer can JIT it (~3 min once)")


def judge_decisions(report: Report, facts: Facts, verdicts: Sequence[Verdict]) -> None:
    env = facts["environ"]
    report.sections["environment"] = env
    report.writer("environment")("overrides in force: " + (
        ", ".join(f"{k}={v}" for k, v in env.items()) if env else "none"))
    result = facts.get("decisions")
    report.sections["decisions"] = result
    say = report.writer("decisions")
    if result is None:
        say(f"--tp decisions skipped: {facts['skipped'].get('decisions', 'not evaluated')}")
        return
    if "error" in result:
        say(f"--tp decisions not evaluated: {result['error']}")
        return
    by_tp = {v.tp: v for v in verdicts}
    for d in result["decisions"]:
        state = {True: "on", False: "off", None: "error"}[d["fusion"]]
        say(f"--tp {d['tp']} ({result['model']}, SGLang's {result.get('source', 'auto-enable')} "
            f"code): fusion {state}: {d['line']}")
        for line in d.get("policy_lines", []):
            say(f"  SGLang logged: {line}")
        verdict = by_tp.get(d["tp"])
        if d["fusion"] and verdict is not None and not verdict.ok:
            say(f"  but the box cannot run it on {_span(verdict.gpus)} ({verdict.why}): SGLang "
                "fails closed to the unfused all-reduce")


def judge_policy(report: Report, facts: Facts, sglang_kind: str, plugin_active: bool,
                 requested: Sequence[int]) -> None:
    """Which method wins where per TP size, by the policy SGLang finds here, or today's
    decision when there is none (``gpu/policy.py``: the one reader and the one place)."""
    found = facts.get("policy")
    say = report.writer("policy")
    if found is None:
        report.sections["policy"] = None
        say("not in this record (recorded before the doctor read the all-reduce policy)")
        return
    n = len(facts["gpus"]["devices"])
    # the TP sizes this box can serve (or asked for); a box that shows no GPU: the usual
    sizes = sorted(set(tp_sizes(n)) | {t for t in requested if t > 1}) or (
        [] if n == 1 else [2, 4, 8])
    modules = facts.get("modules") or {}
    present = (frozenset(modules["present"]) if isinstance(modules.get("present"), list)
               else None)
    majors = {_major(d) for d in facts["gpus"]["devices"]}
    major = next(iter(majors)) if len(majors) == 1 else None
    names = {str(d.get("name")) for d in facts["gpus"]["devices"] if d.get("name")}
    seen = decision.view(found, sizes,
                         override=facts["environ"].get(allreduce_policy.AUTO_ENV),
                         gpu_major=major,
                         gpu_name=names.pop() if len(names) == 1 else None,
                         present=present)
    head, lines = seen.pop("head"), seen.pop("lines")
    sglang = facts["packages"].get("sglang")
    readers = sglang_kind == "ours" or plugin_active
    seen["read_by_sglang"] = readers if sglang else None
    report.sections["policy"] = seen
    for line in head:
        say(line)
    if present is None:
        why = f"({modules['error']})" if modules.get("error") else "(not in this record)"
        say(f"which methods' modules import here: not known {why}; taken as present")
    if sglang and not readers:
        say(f"sglang {sglang} ({sglang_kind}) reads no policy (our patched SGLang does, and "
            "our plugin when it is on); what ours would decide:")
    # What the installed SGLang's own start-up code said about the file (the decisions
    # probe ran it with the policy in place): a reader of version 1 refuses version 2.
    said = [d.get("line") or "" for d in (facts.get("decisions") or {}).get("decisions", [])]
    if seen["source"]["usable"] and any("(version 1)" in line for line in said):
        seen["read_by_sglang"] = False
        say("the installed SGLang reads version 1 only and ignores this file (it keeps today's "
            "rule; its own line is under [decisions]): what the version 2 decision would be:")
    if n == 1 and not lines:
        say("one GPU: no --tp above 1 to decide for")
    # Off SM12x, a TP size no policy decides runs SGLang's code as upstream wrote it.
    upstream = ({int(t["tp"]) for t in seen["tp"] if not t["followed"]}
                if major is not None and major != 12 else set())
    for t in seen["tp"]:
        if int(t["tp"]) in upstream:
            t["decided_by"] = "SGLang's own code (off SM12x)"
    for line in lines:
        m = re.match(r"^all-reduce at TP(\d+):", line)
        say(line if not (m and int(m.group(1)) in upstream) else
            f"all-reduce at TP{m.group(1)}: SGLang's own code, as upstream (SM{major}x: without "
            "a policy SGLang follows here, the patches change nothing; what it decides is under "
            "[decisions])")


def judge(facts: Facts, *, base_gpu: int = 0, tp: Sequence[int] = ()) -> Report:
    """Every rule, over recorded or freshly probed facts."""
    report = Report()
    report.sections["made_by"] = facts.get("made_by")
    have_gpus = judge_gpus(report, facts)
    judge_peers(report, facts)
    verdicts = judge_tp(report, facts, base_gpu, tp) if have_gpus else []
    sglang_kind, plugin_active = judge_packages(report, facts)
    judge_comm(report, facts)
    judge_decisions(report, facts, verdicts)
    judge_policy(report, facts, sglang_kind, plugin_active, tp)
    return report
