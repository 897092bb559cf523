"""Prove from compiled artifacts that a FlashInfer tree builds real SM12x all-reduce kernels.

No SM120 GPU is at hand, so the proof is made of what the compiler produces:

1. *JIT gate*: the tree's own ``flashinfer.jit.comm.gen_trtllm_comm_module()`` runs in a
   subprocess with ``FLASHINFER_CUDA_ARCH_LIST`` set to one architecture. It either returns a
   ``JitSpec`` (whose sources and nvcc command lines drive step 2, so we compile exactly what
   the JIT would) or refuses with an error message, which is recorded verbatim.
2. *Compile*: every source of that module is compiled to one cubin per architecture, sm_90a
   being the reference. Cubins are cached under a content hash of everything that went into
   them (the source, every header ``nvcc -M`` reports, the flags and the compiler's version),
   so re-runs and variants sharing their C++ sources cost nothing.
3. *Inspect*: each cubin is read as ELF; every ``.text.<mangled name>`` section is a kernel
   and its size is the size of its SASS. A kernel that is tiny on SM12x but large on sm_90a
   was compiled with an empty body (SM120-FACTS F3). Programmatic-dependent-launch
   instructions are counted in the SASS (``cuobjdump -sass``); their opcodes are not assumed
   but found per architecture by compiling a tiny kernel that uses ``griddepcontrol``.
4. *Report*: frozen result dataclasses, a verdict per variant and architecture, JSON and a
   markdown rendering that lays the variants side by side.

The probe interpreter needs what ``flashinfer.jit`` imports on a CPU-only machine; see
the ``proof`` dependency group of pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sm120fork.errors import CommandError, VerifyError
from sm120fork.util import proc

log = logging.getLogger("sm120fork")

REFERENCE_ARCH = "sm_90a"
DEFAULT_ARCHS: tuple[str, ...] = ("sm_90a", "sm_120a", "sm_121a")

#: A kernel body at most this large is "empty" when its sm_90a body is large.
EMPTY_BODY_BYTES = 256
#: ... and so is one smaller than this fraction of its sm_90a body.
EMPTY_BODY_FRACTION = 0.10
#: An sm_90a body must exceed this to call its SM12x counterpart empty.
LARGE_BODY_BYTES = 4 * EMPTY_BODY_BYTES

_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([a-z]?)$")
_PROBE_MARK = "@@sm120proof@@"

#: The editable-install links build_backend.py makes under flashinfer/data (an sdist or a
#: git checkout has none; the JIT's paths point through them).
_DATA_LINKS: tuple[tuple[str, str], ...] = (
    ("cutlass", "3rdparty/cutlass"),
    ("spdlog", "3rdparty/spdlog"),
    ("csrc", "csrc"),
    ("include", "include"),
)

# Stubbing the two package modules runs flashinfer/jit/comm.py and what it imports, but not
# flashinfer/__init__.py, which would pull in every kernel wrapper and its dependencies.
_GATE_PROBE = r"""
import importlib, json, sys, traceback, types
from pathlib import Path

tree = Path(sys.argv[1]).resolve()
mark = sys.argv[2]
for name in ("flashinfer", "flashinfer.jit"):
    module = types.ModuleType(name)
    module.__path__ = [str(tree.joinpath(*name.split(".")))]
    sys.modules[name] = module
try:
    comm = importlib.import_module("flashinfer.jit.comm")
except Exception as exc:
    print(mark + json.dumps({"import_error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()}))
    raise SystemExit(0)
try:
    spec = comm.gen_trtllm_comm_module()
except Exception as exc:
    result = {"accepted": False, "error": str(exc), "error_type": type(exc).__name__}
else:
    result = {
        "accepted": True,
        "sources": [str(s) for s in spec.sources],
        "nvcc_flags": list(spec.extra_cuda_cflags or []),
        "commands": [c["command"] for c in spec.get_compile_commands()],
    }
print(mark + json.dumps(result))
"""

_LOCATE_PROBE = r"""
import json, sys
from pathlib import Path
found = {}
for entry in sys.path:
    base = Path(entry or ".")
    for key, pattern in (("cuobjdump", "nvidia/cu*/bin/cuobjdump"),
                         ("nvdisasm", "nvidia/cu*/bin/nvdisasm"),
                         ("cuobjdump", "triton/backends/nvidia/bin/cuobjdump"),
                         ("nvdisasm", "triton/backends/nvidia/bin/nvdisasm")):
        for hit in sorted(base.glob(pattern)):
            found.setdefault(key, str(hit))
print(sys.argv[1] + json.dumps(found))
"""

#: Compiled per architecture to learn which SASS opcodes griddepcontrol becomes.
PDL_CALIBRATION_CU = """\
extern "C" __global__ void pdl_wait(float* x) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  x[threadIdx.x] += 2.0f;
}
extern "C" __global__ void pdl_launch(float* x) {
  x[threadIdx.x] += 3.0f;
  asm volatile("griddepcontrol.launch_dependents;" :::);
}
extern "C" __global__ void plain(float* x) { x[threadIdx.x] += 4.0f; }
"""


# --------------------------------------------------------------------------- architectures


def arch_list_entry(arch: str) -> str:
    """``sm_120a`` -> ``12.0a``, the form FLASHINFER_CUDA_ARCH_LIST takes."""
    match = _ARCH_RE.match(arch)
    if not match:
        raise VerifyError(f"not an architecture name: {arch!r}", fix="use e.g. sm_90a or sm_120a")
    major, minor, suffix = match.groups()
    return f"{major}.{minor}{suffix}"


def gencode_flag(arch: str) -> str:
    """``sm_120a`` -> ``-gencode=arch=compute_120a,code=sm_120a``."""
    arch_list_entry(arch)
    number = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{number},code=sm_{number}"


# --------------------------------------------------------------------------- ELF


@dataclasses.dataclass(frozen=True, kw_only=True)
class ElfSection:
    name: str
    type: int
    offset: int
    size: int


_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_ELF_SECTION = struct.Struct("<IIQQQQIIQQ")


def parse_elf_sections(data: bytes, *, where: str = "<bytes>") -> tuple[ElfSection, ...]:
    """Section headers of a little-endian ELF64 file (a cubin is one)."""
    if len(data) < _ELF_HEADER.size or data[:4] != b"\x7fELF":
        raise VerifyError("not an ELF file", where=where)
    if data[4] != 2 or data[5] != 1:
        raise VerifyError("not a little-endian ELF64 file", where=where)
    fields = _ELF_HEADER.unpack_from(data, 0)
    shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
    if shentsize != _ELF_SECTION.size or shoff + shnum * shentsize > len(data):
        raise VerifyError("truncated or malformed section header table", where=where)
    raw = [_ELF_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    if not raw or shstrndx >= shnum:
        raise VerifyError("no section name table", where=where)
    strtab_offset, strtab_size = raw[shstrndx][4], raw[shstrndx][5]
    names = data[strtab_offset:strtab_offset + strtab_size]

    def name_at(index: int) -> str:
        end = names.find(b"\0", index)
        return names[index:end if end >= 0 else len(names)].decode("utf-8", "replace")

    return tuple(
        ElfSection(name=name_at(r[0]), type=r[1], offset=r[4], size=r[5]) for r in raw
    )


def kernel_sizes(cubin: Path) -> dict[str, int]:
    """Mangled kernel name -> bytes of SASS, from the cubin's ``.text.<name>`` sections.

    A kernel's non-inlined device functions live inside its own section, so the size is
    the whole body a launch runs.
    """
    sections = parse_elf_sections(cubin.read_bytes(), where=str(cubin))
    return {
        s.name.removeprefix(".text."): s.size for s in sections if s.name.startswith(".text.")
    }


# --------------------------------------------------------------------------- tools


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tools:
    """The programs the proof runs; ``None`` where one is missing and its check degrades."""

    python: Path
    nvcc: Path
    nvcc_version: str
    cuobjdump: Path | None
    nvdisasm: Path | None
    cxxfilt: Path | None

    @property
    def can_disassemble(self) -> bool:
        return self.cuobjdump is not None and self.nvdisasm is not None


def find_tools(python: str | os.PathLike[str] | None = None) -> Tools:
    """Locate nvcc, c++filt and the disassemblers (on PATH or in the probe's packages)."""
    interpreter = Path(python) if python else Path(sys.executable)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise VerifyError("nvcc not found on PATH",
                          fix="install the CUDA toolkit (nvcc >= 12.9 for sm_120a)")
    version = proc.run([nvcc, "--version"], quiet=True).stdout.strip().splitlines()[-1]
    located: dict[str, str] = {}
    out = proc.run([interpreter, "-c", _LOCATE_PROBE, _PROBE_MARK], quiet=True).stdout
    for line in out.splitlines():
        if line.startswith(_PROBE_MARK):
            located = json.loads(line.removeprefix(_PROBE_MARK))

    def pick(name: str) -> Path | None:
        on_path = shutil.which(name)
        if on_path:
            return Path(on_path)
        return Path(located[name]) if name in located else None

    tools = Tools(python=interpreter, nvcc=Path(nvcc), nvcc_version=version,
                  cuobjdump=pick("cuobjdump"), nvdisasm=pick("nvdisasm"),
                  cxxfilt=Path(p) if (p := shutil.which("c++filt")) else None)
    if not tools.can_disassemble:
        log.warning("cuobjdump/nvdisasm not found: PDL instructions will be 'not checked' "
                    "(pip install --group proof into %s)", interpreter)
    return tools


def demangle(names: Sequence[str], tools: Tools) -> dict[str, str]:
    """Mangled -> demangled C++ names (identity where c++filt is unavailable)."""
    if tools.cxxfilt is None or not names:
        return {n: n for n in names}
    result: dict[str, str] = {}
    chunk = 200
    for start in range(0, len(names), chunk):
        batch = list(names[start:start + chunk])
        out = proc.run([tools.cxxfilt, *batch], quiet=True).stdout.splitlines()
        if len(out) != len(batch):
            raise VerifyError("c++filt returned a different number of names",
                              where=str(tools.cxxfilt))
        result.update(zip(batch, out, strict=True))
    return result


def kernel_family(demangled: str) -> str:
    """The template (or function) a kernel instantiates: qualified name, no arguments."""
    text = demangled.removeprefix("void ")
    for index, char in enumerate(text):
        if char in "<(":
            return text[:index]
    return text


# --------------------------------------------------------------------------- SASS / PDL


@dataclasses.dataclass(frozen=True, kw_only=True)
class PdlOpcodes:
    """SASS opcodes that ``griddepcontrol.wait`` / ``.launch_dependents`` become on ``arch``."""

    arch: str
    wait: tuple[str, ...]
    launch: tuple[str, ...]


_SASS_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def parse_sass_opcodes(sass: str) -> dict[str, Counter[str]]:
    """``cuobjdump -sass`` text -> per function, how often each base opcode occurs."""
    per_function: dict[str, Counter[str]] = {}
    current: Counter[str] | None = None
    for line in sass.splitlines():
        function = _SASS_FUNCTION.match(line)
        if function:
            current = per_function.setdefault(function.group(1), Counter())
            continue
        instruction = _SASS_INSTRUCTION.match(line)
        if instruction and current is not None:
            current[instruction.group(1)] += 1
    return per_function


def disassemble(cubin: Path, tools: Tools) -> dict[str, Counter[str]]:
    if tools.cuobjdump is None or tools.nvdisasm is None:
        raise VerifyError("cannot disassemble without cuobjdump and nvdisasm")
    out = proc.run([tools.cuobjdump, "-sass", cubin], quiet=True,
                   env={"NVDISASM_PATH": str(tools.nvdisasm.parent)}).stdout
    return parse_sass_opcodes(out)


def calibrate_pdl_opcodes(arch: str, tools: Tools, workdir: Path) -> PdlOpcodes:
    """Compile kernels that differ only by one griddepcontrol and diff their SASS."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "pdl_calibration.cu"
    source.write_text(PDL_CALIBRATION_CU)
    cubin = workdir / f"pdl_calibration_{arch}.cubin"
    proc.run([tools.nvcc, gencode_flag(arch), "-cubin", "-o", cubin, source])
    functions = disassemble(cubin, tools)
    try:
        plain = functions["plain"]
        wait = tuple(sorted(functions["pdl_wait"] - plain))
        launch = tuple(sorted(functions["pdl_launch"] - plain))
    except KeyError as exc:
        raise VerifyError(f"calibration kernel {exc} missing from the SASS",
                          where=str(cubin)) from exc
    if not wait or not launch:
        raise VerifyError(f"griddepcontrol left no SASS trace on {arch}", where=str(cubin),
                          fix="inspect the calibration cubin with cuobjdump -sass")
    log.info("PDL opcodes on %s: wait=%s launch=%s", arch, wait, launch)
    return PdlOpcodes(arch=arch, wait=wait, launch=launch)


# --------------------------------------------------------------------------- JIT gate


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


def _map_data_links(text: str, tree: Path) -> str:
    for link, target in _DATA_LINKS:
        prefix = tree / "flashinfer" / "data" / link
        if not prefix.exists():
            text = re.sub(re.escape(str(prefix)) + r"(?=/|\s|$)", str(tree / target), text)
    return text


def run_gate(tree: Path, arch: str, tools: Tools) -> GateResult:
    """Ask the tree's own JIT for the trtllm comm module, targeting ``arch`` only."""
    tree = tree.resolve()
    entry = arch_list_entry(arch)
    with tempfile.TemporaryDirectory(prefix="sm120proof-jit-") as workspace:
        env = {"PYTHONPATH": str(tree), "FLASHINFER_CUDA_ARCH_LIST": entry,
               "FLASHINFER_WORKSPACE_BASE": workspace, "PYTHONDONTWRITEBYTECODE": "1"}
        log.info("+ FLASHINFER_CUDA_ARCH_LIST=%s PYTHONPATH=%s %s -c <gen_trtllm_comm_module "
                 "probe>", entry, tree, tools.python)
        out = proc.run([tools.python, "-c", _GATE_PROBE, tree, _PROBE_MARK], env=env,
                       cwd=Path(workspace), quiet=True).stdout
    payload = next((line.removeprefix(_PROBE_MARK) for line in out.splitlines()
                    if line.startswith(_PROBE_MARK)), None)
    if payload is None:
        raise VerifyError("the JIT gate probe printed no result", where=str(tree), fix=out[-2000:])
    result: dict[str, Any] = json.loads(payload)
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


# --------------------------------------------------------------------------- compile + cache


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kernel:
    name: str
    display: str
    family: str
    size: int
    pdl_wait: int | None = None
    pdl_launch: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitResult:
    """One translation unit compiled for one architecture."""

    source: str
    cubin: Path
    key: str
    seconds: float
    cached: bool
    kernels: tuple[Kernel, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Job:
    key: str
    arch: str
    source: str
    argv: tuple[str, ...]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _make_dependencies(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    _, _, deps = joined.partition(": ")
    return [d.replace("\\ ", " ") for d in re.split(r"(?<!\\)\s+", deps.strip()) if d]


def cache_key(tree: Path, source: str, flags: Sequence[str], tools: Tools) -> str:
    """sha256 over the compiler version, the flags and every file the unit includes.

    Paths inside the tree are made relative, so two trees with the same bytes share cubins.
    """
    tree = tree.resolve()
    root = str(tree)
    deps = proc.run([tools.nvcc, "-M", tree / source, *flags], quiet=True).stdout
    digest = hashlib.sha256()
    digest.update(tools.nvcc_version.encode())
    digest.update(json.dumps([f.replace(root, "<tree>") for f in flags]).encode())
    digest.update(source.encode())
    for dep in sorted(set(_make_dependencies(deps))):
        path = Path(dep).resolve()
        shown = path.as_posix().replace(root, "<tree>")
        digest.update(f"\0{shown}\0{_file_digest(path)}".encode())
    return digest.hexdigest()


def _compile(job: _Job, cache: Path) -> float:
    cubin = cache / f"{job.key}.cubin"
    partial = cache / f"{job.key}.{os.getpid()}.partial.cubin"
    log.info("compiling %s for %s", job.source, job.arch)
    start = time.perf_counter()
    proc.run([*job.argv, "-o", str(partial)])
    seconds = time.perf_counter() - start
    partial.replace(cubin)
    meta = {"source": job.source, "arch": job.arch, "seconds": round(seconds, 2),
            "argv": list(job.argv)}
    (cache / f"{job.key}.json").write_text(json.dumps(meta, indent=1) + "\n")
    log.info("compiled %s for %s in %.1f s", job.source, job.arch, seconds)
    return seconds


def _cached_seconds(cache: Path, key: str) -> float | None:
    meta = cache / f"{key}.json"
    if (cache / f"{key}.cubin").exists() and meta.exists():
        seconds: float = json.loads(meta.read_text())["seconds"]
        return seconds
    return None


# --------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchResult:
    """One tree variant on one architecture."""

    arch: str
    gate: GateResult
    compiled: bool
    forced: bool = False
    units: tuple[UnitResult, ...] = ()
    pdl_opcodes: PdlOpcodes | None = None

    @property
    def kernels(self) -> dict[str, Kernel]:
        return {k.name: k for unit in self.units for k in unit.kernels}

    @property
    def compile_seconds(self) -> float:
        return sum(unit.seconds for unit in self.units)

    @property
    def all_cached(self) -> bool:
        return bool(self.units) and all(unit.cached for unit in self.units)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VariantResult:
    name: str
    tree: Path
    archs: tuple[ArchResult, ...]

    def arch(self, arch: str) -> ArchResult | None:
        return next((a for a in self.archs if a.arch == arch), None)


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    NOT_CHECKED = "not checked"


def lost_pdl(kernel: Kernel, reference: Kernel) -> bool:
    """The reference kernel waits on / triggers dependent launches and ``kernel`` does not.

    Unknown counts (no disassembler) are never a loss; the verdict reports them apart.
    """
    if None in (kernel.pdl_wait, kernel.pdl_launch, reference.pdl_wait, reference.pdl_launch):
        return False
    return bool(((reference.pdl_wait or 0) > 0 and kernel.pdl_wait == 0)
                or ((reference.pdl_launch or 0) > 0 and kernel.pdl_launch == 0))


def is_empty_body(size: int, reference_size: int) -> bool:
    """A body that shrank to (almost) nothing against a large sm_90a body."""
    if reference_size <= LARGE_BODY_BYTES:
        return False
    return size <= EMPTY_BODY_BYTES or size < EMPTY_BODY_FRACTION * reference_size


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a variant's ``arch`` build carries every sm_90a kernel with a real body."""

    variant: str
    arch: str
    status: Status
    reasons: tuple[str, ...]
    reference_kernels: int
    present: int
    missing: tuple[str, ...]
    empty: tuple[str, ...]
    pdl_reference: tuple[int, int] | None
    pdl: tuple[int, int] | None
    pdl_lost: tuple[str, ...]


def _pdl_totals(kernels: Iterable[Kernel]) -> tuple[int, int] | None:
    wait = launch = 0
    for kernel in kernels:
        if kernel.pdl_wait is None or kernel.pdl_launch is None:
            return None
        wait += kernel.pdl_wait
        launch += kernel.pdl_launch
    return wait, launch


def verdict(variant: VariantResult, arch: str, *,
            reference_arch: str = REFERENCE_ARCH) -> Verdict:
    """Pass when the gate accepts, every reference kernel exists with a real body and
    every kernel with PDL instructions on the reference keeps them."""
    reasons: list[str] = []
    result = variant.arch(arch)
    reference = variant.arch(reference_arch)

    def done(status: Status, **fields: Any) -> Verdict:
        base: dict[str, Any] = {"reference_kernels": 0, "present": 0, "missing": (),
                                "empty": (), "pdl_reference": None, "pdl": None,
                                "pdl_lost": ()}
        base.update(fields)
        return Verdict(variant=variant.name, arch=arch, status=status, reasons=tuple(reasons),
                       **base)

    if result is None:
        reasons.append(f"{arch} was not part of the proof")
        return done(Status.FAIL)
    if not result.gate.accepted:
        reasons.append(f"JIT gate refused {result.gate.arch_list}: {result.gate.error}")
    if reference is None or not reference.compiled or not reference.kernels:
        reasons.append(f"no compiled {reference_arch} reference")
        return done(Status.FAIL)
    if not result.compiled:
        reasons.append(f"not compiled for {arch}")
        return done(Status.FAIL, reference_kernels=len(reference.kernels))
    ref_kernels = reference.kernels
    kernels = result.kernels
    missing = tuple(sorted(set(ref_kernels) - set(kernels)))
    empty = tuple(sorted(
        name for name, ref in ref_kernels.items()
        if name in kernels and is_empty_body(kernels[name].size, ref.size)))
    if missing:
        reasons.append(f"{len(missing)} of {len(ref_kernels)} {reference_arch} kernels missing")
    if empty:
        reasons.append(f"{len(empty)} kernels have an empty body")
    pdl_reference = _pdl_totals(ref_kernels.values())
    pdl = _pdl_totals(kernels.values())
    lost: list[str] = []
    if pdl_reference is not None and pdl is not None:
        lost = [name for name, ref in ref_kernels.items()
                if name in kernels and lost_pdl(kernels[name], ref)]
        if lost:
            reasons.append(f"{len(lost)} kernels lost their PDL instructions")
    status = Status.FAIL if reasons else Status.PASS
    if status is Status.PASS and arch != reference_arch and (pdl_reference is None
                                                             or pdl is None):
        reasons.append("PDL instructions not checked (no cuobjdump/nvdisasm)")
        status = Status.NOT_CHECKED
    return done(status, reference_kernels=len(ref_kernels),
                present=len(ref_kernels) - len(missing), missing=missing, empty=empty,
                pdl_reference=pdl_reference, pdl=pdl, pdl_lost=tuple(sorted(lost)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProofReport:
    variants: tuple[VariantResult, ...]
    archs: tuple[str, ...]
    reference_arch: str
    nvcc_version: str
    pdl_opcodes: tuple[PdlOpcodes, ...]
    wall_seconds: float

    def verdicts(self) -> list[Verdict]:
        return [verdict(v, a, reference_arch=self.reference_arch)
                for v in self.variants for a in self.archs]

    def to_json(self) -> str:
        def encode(value: Any) -> Any:
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, enum.Enum):
                return value.value
            raise TypeError(type(value).__name__)

        document = {
            "report": dataclasses.asdict(self),
            "verdicts": [dataclasses.asdict(v) for v in self.verdicts()],
        }
        return json.dumps(document, indent=1, default=encode, sort_keys=False) + "\n"

    def to_markdown(self) -> str:
        return render_markdown(self)


# --------------------------------------------------------------------------- markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _gate_cell(result: ArchResult | None) -> str:
    if result is None:
        return "-"
    if result.gate.accepted:
        return "accepted"
    return f"refused: `{result.gate.error}`"


def _pdl_cell(v: Verdict, opcodes: Mapping[str, PdlOpcodes]) -> str:
    if v.pdl is None or v.pdl_reference is None:
        return "not checked"
    ops = opcodes.get(v.arch)
    names = f" ({'/'.join(ops.wait)} / {'/'.join(ops.launch)})" if ops else ""
    text = f"{v.pdl[0]} / {v.pdl[1]} vs {v.pdl_reference[0]} / {v.pdl_reference[1]}{names}"
    if v.pdl_lost:
        text += f"; {len(v.pdl_lost)} kernels lost PDL"
    return text


def render_markdown(report: ProofReport) -> str:
    """Summary (variants side by side per architecture) and kernel-family detail tables."""
    opcodes = {p.arch: p for p in report.pdl_opcodes}
    verdicts = {(v.variant, v.arch): v for v in report.verdicts()}
    names = [v.name for v in report.variants]
    lines = ["# SM12x proof: trtllm comm module", "",
             f"Compiler: {report.nvcc_version}. Reference: {report.reference_arch}. "
             f"An SM12x kernel is empty when its body is <= {EMPTY_BODY_BYTES} bytes or < "
             f"{EMPTY_BODY_FRACTION:.0%} of a > {LARGE_BODY_BYTES}-byte {report.reference_arch}"
             " body. PDL: wait / launch instructions summed over kernels, against the "
             f"reference. Proof wall time: {report.wall_seconds:.0f} s.", "",
             "## Summary", ""]
    rows: list[list[str]] = []
    for arch in report.archs:
        results = [v.arch(arch) for v in report.variants]
        row_verdicts = [verdicts[(name, arch)] for name in names]

        def kernels_cell(r: ArchResult | None, v: Verdict) -> str:
            if r is None or not r.compiled:
                return "not compiled"
            return f"{v.present} / {v.reference_kernels}" + (" (forced)" if r.forced else "")

        def seconds_cell(r: ArchResult | None) -> str:
            if r is None or not r.compiled:
                return "-"
            return f"{r.compile_seconds:.1f}" + (" (cached)" if r.all_cached else "")

        rows += [
            [arch, "JIT gate", *(_gate_cell(r) for r in results)],
            [arch, f"kernels present / {report.reference_arch}",
             *(kernels_cell(r, v) for r, v in zip(results, row_verdicts, strict=True))],
            [arch, "empty kernels", *(str(len(v.empty)) if r is not None and r.compiled
                                      else "-" for r, v in zip(results, row_verdicts,
                                                               strict=True))],
            [arch, "PDL", *(_pdl_cell(v, opcodes) if r is not None and r.compiled else "-"
                            for r, v in zip(results, row_verdicts, strict=True))],
            [arch, "compile s", *(seconds_cell(r) for r in results)],
            [arch, "verdict", *(f"**{v.status.value.upper()}**" for v in row_verdicts)],
        ]
    lines += _table(["arch", "check", *names], rows)
    lines += ["", "## Compile seconds per translation unit", "",
              "Wall time of each nvcc run (cached: taken from the run that made the cubin).",
              ""]
    sources = sorted({u.source for v in report.variants for a in v.archs for u in a.units})
    unit_rows = []
    for variant in report.variants:
        for result in variant.archs:
            if not result.compiled:
                continue
            by_source = {u.source: u for u in result.units}
            unit_rows.append([variant.name, result.arch, *(
                "-" if (u := by_source.get(s)) is None
                else f"{u.seconds:.1f}" + (" (cached)" if u.cached else "") for s in sources)])
    lines += _table(["variant", "arch", *(Path(s).name for s in sources)], unit_rows)
    for variant in report.variants:
        lines += ["", f"## Kernel families: {variant.name}", ""]
        lines += _family_table(variant, report)
    return "\n".join(lines) + "\n"


def _family_table(variant: VariantResult, report: ProofReport) -> list[str]:
    compiled = [a for a in variant.archs if a.compiled]
    if not compiled:
        return ["Nothing was compiled."]
    reference = variant.arch(report.reference_arch)
    ref_kernels = reference.kernels if reference and reference.compiled else {}
    sizes: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    empties: dict[str, Counter[str]] = defaultdict(Counter)
    no_pdl: dict[str, Counter[str]] = defaultdict(Counter)
    for result in compiled:
        for kernel in result.kernels.values():
            sizes[kernel.family][result.arch].append(kernel.size)
            ref = ref_kernels.get(kernel.name)
            if ref is None or result.arch == report.reference_arch:
                continue
            empties[kernel.family][result.arch] += is_empty_body(kernel.size, ref.size)
            no_pdl[kernel.family][result.arch] += lost_pdl(kernel, ref)
    rows = []
    for family in sorted(sizes):
        row = [f"`{family}`"]
        for result in compiled:
            found = sizes[family].get(result.arch, [])
            if not found:
                row.append("-")
                continue
            cell = f"{len(found)} / {min(found)} / {statistics.median(found):.0f}"
            notes = [f"{count} {what}" for count, what in (
                (empties[family][result.arch], "empty"),
                (no_pdl[family][result.arch], "lost PDL")) if count]
            if notes:
                cell += f" ({', '.join(notes)})"
            row.append(cell)
        rows.append(row)
    header = ["family", *(f"{a.arch}: n / min B / median B" for a in compiled)]
    return _table(header, rows)


# --------------------------------------------------------------------------- driver


def pdl_counts(cubin: Path, opcodes: PdlOpcodes, tools: Tools) -> dict[str, tuple[int, int]]:
    """Per kernel, how many PDL wait / launch instructions its SASS holds.

    Disassembling a cubin of ~900 kernels takes tens of seconds and ~150 MB of text, so
    the counts are kept beside the cubin, keyed by the opcodes they counted.
    """
    memo = cubin.with_suffix(".pdl.json")
    wanted = {"wait": list(opcodes.wait), "launch": list(opcodes.launch)}
    if memo.exists():
        stored = json.loads(memo.read_text())
        if stored["opcodes"] == wanted:
            return {name: (w, la) for name, (w, la) in stored["counts"].items()}
    log.info("disassembling %s", cubin.name)
    counts = {
        name: (sum(ops[o] for o in opcodes.wait), sum(ops[o] for o in opcodes.launch))
        for name, ops in disassemble(cubin, tools).items()
    }
    memo.write_text(json.dumps({"opcodes": wanted, "counts": counts}) + "\n")
    return counts


def _inspect(cubin: Path, tools: Tools, opcodes: PdlOpcodes | None,
             names: Mapping[str, str]) -> tuple[Kernel, ...]:
    sizes = kernel_sizes(cubin)
    counts = pdl_counts(cubin, opcodes, tools) if opcodes is not None else None
    kernels = []
    for name, size in sorted(sizes.items()):
        wait = launch = None
        if counts is not None:
            wait, launch = counts.get(name, (0, 0))
        display = names.get(name, name)
        kernels.append(Kernel(name=name, display=display, family=kernel_family(display),
                              size=size, pdl_wait=wait, pdl_launch=launch))
    return tuple(kernels)


def _raise_first(futures: Iterable[Future[Any]], what: str) -> None:
    for future in futures:
        error = future.exception()
        if error is None:
            continue
        if isinstance(error, VerifyError):
            raise error
        if isinstance(error, CommandError):
            raise VerifyError(f"{what} failed: {error.what}", where=error.where,
                              fix="see the output below", detail=error.detail) from error
        raise VerifyError(f"{what} failed: {error!r}") from error


def prove(
    variants: Mapping[str, Path],
    *,
    archs: Sequence[str] = DEFAULT_ARCHS,
    cache_dir: Path,
    jobs: int = 2,
    force_compile: Iterable[str] = (),
    python: str | os.PathLike[str] | None = None,
    reference_arch: str = REFERENCE_ARCH,
) -> ProofReport:
    """Gate, compile and inspect every variant's trtllm comm module for ``archs``.

    ``force_compile`` names architectures to compile even where the gate refuses (with the
    reference architecture's JIT flags, retargeted), to show what an unpatched tree would
    build. ``python`` is the interpreter that imports the trees' ``flashinfer.jit`` (default:
    this one). At most ``jobs`` compilers or disassemblers run at once.
    """
    started = time.perf_counter()
    if reference_arch not in archs:
        raise VerifyError(f"the reference architecture {reference_arch} is not among {archs}")
    forced = set(force_compile)
    tools = find_tools(python)
    cache = cache_dir.resolve() / "cubins"
    cache.mkdir(parents=True, exist_ok=True)
    workers = max(1, jobs)

    opcodes: dict[str, PdlOpcodes] = {}
    if tools.can_disassemble:
        with tempfile.TemporaryDirectory(prefix="sm120proof-pdl-") as scratch:
            for arch in archs:
                opcodes[arch] = calibrate_pdl_opcodes(arch, tools, Path(scratch))

    # 1. gates, and the compile each accepted (or forced) architecture asks for
    planned: dict[tuple[str, str], tuple[GateResult, list[tuple[Path, str, tuple[str, ...]]],
                                         bool]] = {}
    for name, given_tree in variants.items():
        tree = given_tree.resolve()
        gates = {arch: run_gate(tree, arch, tools) for arch in archs}
        for arch in archs:
            gate = gates[arch]
            units: list[tuple[Path, str, tuple[str, ...]]] = []
            was_forced = False
            if gate.accepted:
                units = [(tree, source, gate.compile_flags) for source in gate.sources]
            elif arch in forced and gates[reference_arch].accepted:
                ref = gates[reference_arch]
                flags = tuple(gencode_flag(arch) if f == gencode_flag(reference_arch) else f
                              for f in ref.compile_flags)
                units = [(tree, source, flags) for source in ref.sources]
                was_forced = True
            planned[(name, arch)] = (gate, units, was_forced)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        # 2. content keys (nvcc -M per unit), then the compiles the cache lacks
        key_futures = {
            (name, arch, unit[1]): pool.submit(cache_key, unit[0], unit[1], unit[2], tools)
            for (name, arch), (_, units, _) in planned.items() for unit in units
        }
        _raise_first(key_futures.values(), "computing cache keys")
        jobs_by_plan: dict[tuple[str, str], list[_Job]] = {}
        all_jobs: dict[str, _Job] = {}
        for (name, arch), (_, units, _) in planned.items():
            job_list = []
            for tree, source, flags in units:
                key = key_futures[(name, arch, source)].result()
                job = _Job(key=key, arch=arch, source=source,
                           argv=(str(tools.nvcc), str(tree / source), *flags, "-cubin"))
                job_list.append(job)
                all_jobs.setdefault(key, job)
            jobs_by_plan[(name, arch)] = job_list
        pending = [job for key, job in all_jobs.items() if _cached_seconds(cache, key) is None]
        log.info("%d cubins needed, %d cached, compiling %d with %d jobs",
                 len(all_jobs), len(all_jobs) - len(pending), len(pending), workers)
        compiled = {job.key: pool.submit(_compile, job, cache) for job in pending}
        _raise_first(compiled.values(), "compiling the trtllm comm module")

        # 3. inspect every cubin once
        all_names: set[str] = set()
        for key in all_jobs:
            all_names.update(kernel_sizes(cache / f"{key}.cubin"))
        names = demangle(sorted(all_names), tools)
        inspections = {
            key: pool.submit(_inspect, cache / f"{key}.cubin", tools, opcodes.get(job.arch),
                             names)
            for key, job in all_jobs.items()
        }
        _raise_first(inspections.values(), "inspecting the cubins")

    # 4. results; a cubin counts as compiled by the first unit that needed it in this run
    results: list[VariantResult] = []
    charged: set[str] = set()
    for name, given_tree in variants.items():
        arch_results = []
        for arch in archs:
            gate, _, was_forced = planned[(name, arch)]
            unit_results = []
            for job in jobs_by_plan[(name, arch)]:
                fresh = job.key in compiled and job.key not in charged
                charged.add(job.key)
                unit_results.append(UnitResult(
                    source=job.source, cubin=cache / f"{job.key}.cubin", key=job.key,
                    seconds=_cached_seconds(cache, job.key) or 0.0, cached=not fresh,
                    kernels=inspections[job.key].result()))
            arch_results.append(ArchResult(arch=arch, gate=gate, compiled=bool(unit_results),
                                           forced=was_forced, units=tuple(unit_results),
                                           pdl_opcodes=opcodes.get(arch)))
        results.append(VariantResult(name=name, tree=given_tree.resolve(),
                                     archs=tuple(arch_results)))
    return ProofReport(variants=tuple(results), archs=tuple(archs),
                       reference_arch=reference_arch, nvcc_version=tools.nvcc_version,
                       pdl_opcodes=tuple(opcodes[a] for a in archs if a in opcodes),
                       wall_seconds=time.perf_counter() - started)
