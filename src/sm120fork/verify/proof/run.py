"""The compile proof: the JIT gates (what the tree's own FlashInfer JIT says for each
architecture), compiles cached under a content hash of the source, every header ``nvcc -M``
reports, the flags and the compiler's version, inspection for every variant, and the
verdict per variant and architecture."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
import re
import shlex
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sm120fork.cuda.cubin import (
    REFERENCE_ARCH,
    Kernel,
    PdlOpcodes,
    Tools,
    arch_list_entry,
    calibrate_pdl_opcodes,
    demangle,
    find_tools,
    gencode_flag,
    inspect_cubin,
    kernel_sizes,
    missing_and_empty,
    probe,
    require_tools_in_ci,
    runtime_calls,
)
from sm120fork.errors import CommandError, VerifyError
from sm120fork.util import proc
from sm120fork.util.files import sha256_file

log = logging.getLogger("sm120fork")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateResult:
    """What ``gen_trtllm_comm_module()`` said for one FLASHINFER_CUDA_ARCH_LIST value."""

    arch: str
    arch_list: str
    accepted: bool
    error: str | None = None
    sources: tuple[str, ...] = ()
    nvcc_flags: tuple[str, ...] = ()
    compile_flags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitResult:
    source: str
    cubin: Path
    key: str
    seconds: float
    cached: bool
    kernels: tuple[Kernel, ...]
    #: The CUDA runtime functions its host object calls (None: no host object).
    host_calls: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchResult:
    arch: str
    gate: GateResult
    compiled: bool
    forced: bool = False
    #: Whether the proof meant to compile it (a variant need not be built everywhere).
    planned: bool = True
    units: tuple[UnitResult, ...] = ()
    pdl_opcodes: PdlOpcodes | None = None

    @property
    def kernels(self) -> dict[str, Kernel]:
        return {k.name: k for unit in self.units for k in unit.kernels}

    def units_calling(self, function: str) -> dict[str, bool] | None:
        """Per translation unit, whether its host object calls ``function`` (None: no
        host objects were built for this architecture)."""
        if not self.units or any(u.host_calls is None for u in self.units):
            return None
        return {u.source: function in (u.host_calls or ()) for u in self.units}


@dataclasses.dataclass(frozen=True, kw_only=True)
class VariantResult:
    name: str
    tree: Path
    archs: tuple[ArchResult, ...]

    def arch(self, arch: str) -> ArchResult | None:
        return next((a for a in self.archs if a.arch == arch), None)


#: The host-side call the F5 check looks for (the device's cluster-size answer).
CLUSTER_QUERY = "cudaOccupancyMaxPotentialClusterSize"


class Status(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_CHECKED = "not checked"


def lost_pdl(kernel: Kernel, reference: Kernel) -> bool:
    """The reference kernel waits on / triggers dependent launches and ``kernel`` does
    not (unknown counts are never a loss)."""
    if None in (kernel.pdl_wait, kernel.pdl_launch, reference.pdl_wait, reference.pdl_launch):
        return False
    return bool(((reference.pdl_wait or 0) > 0 and kernel.pdl_wait == 0)
                or ((reference.pdl_launch or 0) > 0 and kernel.pdl_launch == 0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a variant's ``arch`` build carries every sm_90a kernel with a real body."""

    variant: str
    arch: str
    status: Status
    reasons: tuple[str, ...]
    reference_kernels: int = 0
    present: int = 0
    missing: tuple[str, ...] = ()
    empty: tuple[str, ...] = ()
    pdl_reference: tuple[int, int] | None = None
    pdl: tuple[int, int] | None = None
    pdl_lost: tuple[str, ...] = ()


def _pdl_totals(kernels: Iterable[Kernel]) -> tuple[int, int] | None:
    counts = [(k.pdl_wait, k.pdl_launch) for k in kernels]
    if any(None in pair for pair in counts):
        return None
    return sum(w for w, _ in counts if w), sum(la for _, la in counts if la)


def verdict(variant: VariantResult, arch: str) -> Verdict:
    """Pass when the gate accepts and every reference kernel exists with a real body and
    its PDL instructions; a build not planned whose gate accepts is "not checked"."""
    reasons: list[str] = []
    result = variant.arch(arch)
    reference = variant.arch(REFERENCE_ARCH)

    def done(status: Status, **fields: Any) -> Verdict:
        return Verdict(variant=variant.name, arch=arch, status=status, reasons=tuple(reasons),
                       **fields)

    if result is None:
        reasons.append(f"{arch} was not part of the proof")
        return done(Status.FAIL)
    if not result.gate.accepted:
        reasons.append(f"JIT gate refused {result.gate.arch_list}: {result.gate.error}")
    if not result.compiled and not result.planned and result.gate.accepted:
        reasons.append(f"gate accepts; not compiled for {arch} in this proof")
        return done(Status.NOT_CHECKED)
    ref_kernels = reference.kernels if reference is not None and reference.compiled else {}
    if not ref_kernels:
        reasons.append(f"no compiled {REFERENCE_ARCH} reference")
        return done(Status.FAIL)
    if not result.compiled:
        reasons.append(f"not compiled for {arch}")
        return done(Status.FAIL, reference_kernels=len(ref_kernels))
    kernels = result.kernels
    missing, empty = missing_and_empty({n: k.size for n, k in ref_kernels.items()},
                                       {n: k.size for n, k in kernels.items()})
    pdl_reference = _pdl_totals(ref_kernels.values())
    pdl = _pdl_totals(kernels.values())
    checked = pdl_reference is not None and pdl is not None
    lost = sorted(name for name, ref in ref_kernels.items()
                  if checked and name in kernels and lost_pdl(kernels[name], ref))
    for count, what in ((len(missing), f"of {len(ref_kernels)} {REFERENCE_ARCH} kernels missing"),
                        (len(empty), "kernels have an empty body"),
                        (len(lost), "kernels lost their PDL instructions")):
        if count:
            reasons.append(f"{count} {what}")
    status = Status.FAIL if reasons else Status.PASS
    if status is Status.PASS and arch != REFERENCE_ARCH and not checked:
        reasons.append("PDL instructions not checked (no cuobjdump/nvdisasm)")
        status = Status.NOT_CHECKED
    return done(status, reference_kernels=len(ref_kernels),
                present=len(ref_kernels) - len(missing), missing=missing, empty=empty,
                pdl_reference=pdl_reference, pdl=pdl, pdl_lost=tuple(lost))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProofReport:
    variants: tuple[VariantResult, ...]
    archs: tuple[str, ...]
    reference_arch: str
    nvcc_version: str
    pdl_opcodes: tuple[PdlOpcodes, ...]
    wall_seconds: float
    #: Architectures whose host objects were built (the CUDA runtime calls are read there).
    host_archs: tuple[str, ...] = ()

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def verdicts(self) -> list[Verdict]:
        return [verdict(v, a) for v in self.variants for a in self.archs]

    def document(self) -> Any:
        """The report and its verdicts as JSON data (a path as its text)."""
        data = {"report": dataclasses.asdict(self),
                "verdicts": [dataclasses.asdict(v) for v in self.verdicts()]}
        return json.loads(json.dumps(data, default=str))


#: The editable-install links build_backend.py makes under flashinfer/data (an sdist or a
#: git checkout has none; the JIT's paths point through them).
_DATA_LINKS = {"cutlass": "3rdparty/cutlass", "spdlog": "3rdparty/spdlog", "csrc": "csrc",
               "include": "include"}

_GATE_PROBE = r"""
tree = Path(sys.argv[1]).resolve()
mark = sys.argv[2]
fake_flashinfer(tree / "flashinfer")
try:
    comm = importlib.import_module("flashinfer.jit.comm")
except Exception as exc:
    print(mark + json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
try:
    spec = comm.gen_trtllm_comm_module()
except Exception as exc:
    result = {"accepted": False, "error": str(exc)}
else:
    result = {"accepted": True, "nvcc_flags": list(spec.extra_cuda_cflags or []),
              "commands": [c["command"] for c in spec.get_compile_commands()]}
print(mark + json.dumps(result))
"""


def _map_data_links(text: str, tree: Path) -> str:
    for link, target in _DATA_LINKS.items():
        prefix = tree / "flashinfer" / "data" / link
        if not prefix.exists():
            text = re.sub(re.escape(str(prefix)) + r"(?=/|\s|$)", str(tree / target), text)
    return text


def run_gate(tree: Path, arch: str, tools: Tools) -> GateResult:
    """Ask the tree's own JIT for the trtllm comm module, targeting ``arch`` only."""
    tree = tree.resolve()
    entry = arch_list_entry(arch)
    with tempfile.TemporaryDirectory(prefix="sm120fork-proof-jit-") as workspace:
        env = {"PYTHONPATH": str(tree), "FLASHINFER_CUDA_ARCH_LIST": entry,
               "FLASHINFER_WORKSPACE_BASE": workspace, "PYTHONDONTWRITEBYTECODE": "1"}
        log.info("+ FLASHINFER_CUDA_ARCH_LIST=%s PYTHONPATH=%s %s -c <gen_trtllm_comm_module "
                 "probe>", entry, tree, tools.python)
        result = probe(tools.python, _GATE_PROBE, tree, what="the JIT gate probe",
                       where=str(tree), env=env, cwd=Path(workspace))
    if "import_error" in result:
        raise VerifyError(
            f"cannot import flashinfer.jit.comm: {result['import_error']}", where=str(tree),
            fix=f"pip install --group proof (pyproject.toml) into {tools.python}")
    if not result["accepted"]:
        log.info("JIT gate %s refused %s: %s", tree.name, entry, result["error"])
        return GateResult(arch=arch, arch_list=entry, accepted=False, error=result["error"])
    sources: list[str] = []
    flag_sets: set[tuple[str, ...]] = set()
    for command in result["commands"]:
        argv = shlex.split(_map_data_links(command, tree))
        if len(argv) < 5 or argv[1] != "-c" or argv[-2] != "-o":
            raise VerifyError(f"unexpected JIT compile command: {command}", where=str(tree))
        sources.append(Path(argv[2]).relative_to(tree).as_posix())
        flag_sets.add(tuple(argv[3:-2]))
    if len(flag_sets) != 1:
        raise VerifyError("the JIT compiles its sources with different flags", where=str(tree))
    flags = flag_sets.pop()
    if gencode_flag(arch) not in flags:
        raise VerifyError(f"the JIT's flags do not target {arch}: {shlex.join(flags)}",
                          where=str(tree))
    return GateResult(arch=arch, arch_list=entry, accepted=True, sources=tuple(sources),
                      nvcc_flags=tuple(result["nvcc_flags"]), compile_flags=flags)


def make_dependencies(text: str) -> list[str]:
    _, _, deps = text.replace("\\\n", " ").partition(": ")
    return [d.replace("\\ ", " ") for d in re.split(r"(?<!\\)\s+", deps.strip()) if d]


def cache_key(tree: Path, source: str, flags: Sequence[str], tools: Tools) -> str:
    """sha256 over the compiler version, the flags and every file the unit includes (paths
    relative to the tree: two trees with the same bytes share cubins)."""
    tree = tree.resolve()
    root = str(tree)
    deps = proc.run([tools.nvcc, "-M", tree / source, *flags], quiet=True).stdout
    digest = hashlib.sha256()
    digest.update(tools.nvcc_version.encode())
    digest.update(json.dumps([f.replace(root, "<tree>") for f in flags]).encode())
    digest.update(source.encode())
    for dep in sorted(set(make_dependencies(deps))):
        path = Path(dep).resolve()
        shown = path.as_posix().replace(root, "<tree>")
        digest.update(f"\0{shown}\0{sha256_file(path)}".encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """One translation unit for one architecture; ``host``: keep the host object too."""

    key: str
    arch: str
    source: str
    argv: tuple[str, ...]
    host: bool = False

    def outputs(self, cache: Path) -> list[Path]:
        return [cache / f"{self.key}{suffix}" for suffix in (".json", ".cubin", ".o")
                if self.host or suffix != ".o"]


def compile_job(job: Job, cache: Path) -> float:
    log.info("compiling %s for %s%s", job.source, job.arch, " (+ host object)" if job.host else "")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sm120fork-proof-nvcc-", dir=cache) as scratch:
        work = Path(scratch)
        # With a host object, one nvcc run gives both: the object, and the cubin it embeds.
        proc.run([*job.argv, *(["-c", "--keep", "--keep-dir", str(work), "-o",
                                str(work / "unit.o")] if job.host else
                               ["-cubin", "-o", str(work / "unit.cubin")])])
        cubins = sorted(work.glob("*.cubin"))
        if len(cubins) != 1:
            raise VerifyError(f"expected one kept cubin, found {[c.name for c in cubins]}",
                              where=job.source)
        cubins[0].replace(cache / f"{job.key}.cubin")
        if job.host:
            (work / "unit.o").replace(cache / f"{job.key}.o")
    seconds = time.perf_counter() - start
    meta = {"source": job.source, "arch": job.arch, "seconds": round(seconds, 2),
            "host": job.host, "argv": list(job.argv)}
    (cache / f"{job.key}.json").write_text(json.dumps(meta, indent=1) + "\n")
    log.info("compiled %s for %s in %.1f s", job.source, job.arch, seconds)
    return seconds


def cached_seconds(cache: Path, job: Job) -> float | None:
    """Seconds of the run that made ``job``'s cached outputs; None if any is missing."""
    if not all(p.exists() for p in job.outputs(cache)):
        return None
    seconds: float = json.loads((cache / f"{job.key}.json").read_text())["seconds"]
    return seconds


def _raise_first(futures: Iterable[Future[Any]], what: str) -> None:
    for error in (future.exception() for future in futures):
        if isinstance(error, CommandError):
            raise VerifyError(f"{what} failed: {error.what}", where=error.where,
                              fix="see the output below", detail=error.detail) from error
        if error is not None:
            raise error


_Unit = tuple[Path, str, tuple[str, ...]]
_Planned = dict[tuple[str, str], tuple[ArchResult, list[_Unit]]]


def _plan_variants(variants: Mapping[str, Path], archs: Sequence[str], tools: Tools,
                   compile_archs: Mapping[str, Sequence[str]], forced: Iterable[str]
                   ) -> _Planned:
    planned: _Planned = {}
    for name, given_tree in variants.items():
        tree = given_tree.resolve()
        gates = {arch: run_gate(tree, arch, tools) for arch in archs}
        wanted = {*compile_archs.get(name, archs), REFERENCE_ARCH}
        ref = gates[REFERENCE_ARCH]
        for arch, gate in gates.items():
            # where the gate refuses, a forced arch compiles with the reference's flags
            was_forced = (arch in wanted and not gate.accepted and arch in forced
                          and ref.accepted)
            units: list[_Unit] = []
            if arch in wanted and gate.accepted:
                units = [(tree, source, gate.compile_flags) for source in gate.sources]
            elif was_forced:
                flags = tuple(gencode_flag(arch) if f == gencode_flag(REFERENCE_ARCH) else f
                              for f in ref.compile_flags)
                units = [(tree, source, flags) for source in ref.sources]
            planned[(name, arch)] = (ArchResult(arch=arch, gate=gate, compiled=bool(units),
                                                forced=was_forced, planned=arch in wanted), units)
    return planned


def prove(
    variants: Mapping[str, Path],
    *,
    archs: Sequence[str],
    cache_dir: Path,
    jobs: int = 2,
    compile_archs: Mapping[str, Sequence[str]] | None = None,
    force_compile: Iterable[str] = (),
    host_archs: Iterable[str] = (),
    python: str | os.PathLike[str] | None = None,
) -> ProofReport:
    """Gate every variant for ``archs``; compile and inspect its trtllm comm module.

    ``compile_archs`` limits the architectures compiled per variant; ``force_compile``
    compiles where the gate refuses (the reference's flags, retargeted); ``host_archs``
    keep host objects (to read the launchers' CUDA runtime calls).
    """
    started = time.perf_counter()
    if REFERENCE_ARCH not in archs:
        raise VerifyError(f"the reference architecture {REFERENCE_ARCH} is not among {archs}")
    hosts = tuple(a for a in archs if a in set(host_archs))
    tools = find_tools(python)
    require_tools_in_ci(tools)
    cache = cache_dir.resolve() / "cubins"
    cache.mkdir(parents=True, exist_ok=True)
    opcodes: dict[str, PdlOpcodes] = {}
    if tools.can_disassemble:
        with tempfile.TemporaryDirectory(prefix="sm120fork-proof-pdl-") as scratch:
            opcodes = {a: calibrate_pdl_opcodes(a, tools, Path(scratch)) for a in archs}
    # 1. gates, and the compile each accepted (or forced) architecture asks for
    planned = _plan_variants(variants, archs, tools, compile_archs or {}, set(force_compile))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # 2. content keys (nvcc -M per unit), then the compiles the cache lacks
        keys = {unit: pool.submit(cache_key, *unit, tools)
                for _, units in planned.values() for unit in units}
        _raise_first(keys.values(), "computing cache keys")
        plans: dict[tuple[str, str], list[Job]] = {}
        all_jobs: dict[str, Job] = {}  # one compile per content key
        for (name, arch), (_, units) in planned.items():
            for tree, source, flags in units:
                key = keys[(tree, source, flags)].result()
                all_jobs[key] = Job(key=key, arch=arch, source=source,
                                    argv=(str(tools.nvcc), str(tree / source), *flags),
                                    host=arch in hosts or (key in all_jobs and all_jobs[key].host))
                plans.setdefault((name, arch), []).append(all_jobs[key])
        pending = [job for job in all_jobs.values() if cached_seconds(cache, job) is None]
        log.info("%d cubins needed, %d cached, compiling %d with %d jobs", len(all_jobs),
                 len(all_jobs) - len(pending), len(pending), max(1, jobs))
        compiled = {job.key: pool.submit(compile_job, job, cache) for job in pending}
        _raise_first(compiled.values(), "compiling the trtllm comm module")
        # 3. inspect every cubin (and host object) once
        names = demangle(sorted({n for key in all_jobs
                                 for n in kernel_sizes(cache / f"{key}.cubin")}))
        inspections = {key: pool.submit(inspect_cubin, cache / f"{key}.cubin", tools,
                                        opcodes.get(job.arch), names)
                       for key, job in all_jobs.items()}
        _raise_first(inspections.values(), "inspecting the cubins")
    calls = {key: runtime_calls(cache / f"{key}.o") for key, job in all_jobs.items() if job.host}

    # 4. results; a cubin counts as compiled by the first unit that needed it in this run
    charged: set[str] = set()

    def unit(job: Job) -> UnitResult:
        fresh = job.key in compiled and job.key not in charged
        charged.add(job.key)
        return UnitResult(source=job.source, cubin=cache / f"{job.key}.cubin", key=job.key,
                          seconds=cached_seconds(cache, all_jobs[job.key]) or 0.0,
                          cached=not fresh, kernels=inspections[job.key].result(),
                          host_calls=calls.get(job.key) if job.arch in hosts else None)

    results = [VariantResult(name=name, tree=tree.resolve(), archs=tuple(
        dataclasses.replace(planned[(name, arch)][0], pdl_opcodes=opcodes.get(arch),
                            units=tuple(unit(job) for job in plans.get((name, arch), ())))
        for arch in archs)) for name, tree in variants.items()]
    return ProofReport(variants=tuple(results), archs=tuple(archs),
                       reference_arch=REFERENCE_ARCH, nvcc_version=tools.nvcc_version,
                       pdl_opcodes=tuple(opcodes[a] for a in archs if a in opcodes),
                       wall_seconds=time.perf_counter() - started, host_archs=hosts)
