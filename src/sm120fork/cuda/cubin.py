"""What nvcc made and the tools that read it: architecture names (``sm_120a`` -> FlashInfer's
arch list entry, nvcc's flag); the CUDA binary tools (cuobjdump, nvdisasm, c++filt, on
``PATH`` or in the pip packages of the interpreter that runs them) and the probe runner;
kernels (a cubin's ``.text.<mangled name>`` sections) and their SASS sizes, PDL
instructions, and a host object's calls (its undefined symbols)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import statistics
import struct
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from sm120fork.cuda.toolkit import require_nvcc
from sm120fork.errors import ConfigError, ToolkitError, VerifyError
from sm120fork.util import proc

log = logging.getLogger("sm120fork")

#: The architecture every other build's kernels are compared with.
REFERENCE_ARCH = "sm_90a"
#: What FlashInfer's compilation context builds for every 12.x GPU (CUDA >= 12.9): the
#: cubin SM120 and SM121 users run.
SHIPPED_SM12X_ARCH = "sm_120f"

_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([a-z]?)$")


def arch_list_entry(arch: str) -> str:
    """The FLASHINFER_CUDA_ARCH_LIST entry: ``sm_120a`` -> ``12.0a``; ``sm_120f`` -> ``12.0``
    (FlashInfer normalises a 12.x capability to compute_120f itself)."""
    match = _ARCH_RE.match(arch)
    if not match:
        raise VerifyError(f"not an architecture name: {arch!r}",
                          fix="use e.g. sm_90a, sm_120a or sm_120f")
    major, minor, suffix = match.groups()
    return f"{major}.{minor}" + ("" if suffix == "f" else suffix)


def gencode_flag(arch: str) -> str:
    """``sm_120a`` -> ``-gencode=arch=compute_120a,code=sm_120a``."""
    arch_list_entry(arch)
    number = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{number},code=sm_{number}"


def is_sm12x(arch: str) -> bool:
    match = _ARCH_RE.match(arch)
    return bool(match) and match.group(1) == "12"  # type: ignore[union-attr]


PROBE_MARK = "@@sm120fork-probe@@"

#: Every probe script's first lines: ``fake_flashinfer(root)`` stubs the packages
#: ``flashinfer`` and ``flashinfer.jit`` of the folder ``root``, so flashinfer/jit imports
#: without flashinfer/__init__.py, which would pull in every kernel wrapper and its needs.
_PRELUDE = r"""
import importlib, json, sys, types
from pathlib import Path

def fake_flashinfer(root):
    for name in ("flashinfer", "flashinfer.jit"):
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = module
"""

_SYS_PATH_PROBE = "print(sys.argv[1] + json.dumps(sys.path))"
#: Where pip puts a CUDA binary tool: NVIDIA's packages, then triton's copies.
_PIP_TOOLS = ("nvidia/cu*/bin/{}", "triton/backends/nvidia/bin/{}")


def _tool(name: str, paths: Sequence[str], patterns: Sequence[str] = _PIP_TOOLS) -> Path | None:
    """``name`` on PATH, else the first ``name`` pip installed in a folder of ``paths`` (an
    interpreter's sys.path)."""
    if on_path := shutil.which(name):
        return Path(on_path)
    return next((hit for entry in paths for pattern in patterns
                 for hit in sorted(Path(entry or ".").glob(pattern.format(name)))), None)


def probe(python: str | os.PathLike[str], script: str, *args: str | os.PathLike[str],
          what: str, where: str | None = None, error: type[ToolkitError] = VerifyError,
          **run: Any) -> Any:
    """Run the prelude and ``script`` in ``python`` (PROBE_MARK its last argument, ``run`` to
    proc.run): the JSON after the mark on the last stdout line with it, else ``error``."""
    out = proc.run([python, "-c", _PRELUDE + script, *args, PROBE_MARK], quiet=True, **run)
    payload = next((line.removeprefix(PROBE_MARK) for line in reversed(out.stdout.splitlines())
                    if line.startswith(PROBE_MARK)), None)
    if payload is None:
        raise error(f"{what} printed no result", where=where,
                    detail=(out.stdout + out.stderr)[-3000:])
    return json.loads(payload)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tools:
    """The programs the proof runs; ``None`` where one is missing and its check degrades."""

    python: Path
    nvcc: Path
    nvcc_version: str
    cuobjdump: Path | None
    nvdisasm: Path | None

    @property
    def can_disassemble(self) -> bool:
        return self.cuobjdump is not None and self.nvdisasm is not None


def require_tools_in_ci(tools: Tools) -> None:
    """On CI (``CI=true``) a missing disassembler is an error, not a degraded check."""
    if os.environ.get("CI", "").lower() == "true" and not tools.can_disassemble:
        raise VerifyError("cuobjdump/nvdisasm not found and CI=true",
                          where=str(tools.python),
                          fix="pip install --group proof (pyproject.toml)")


def find_tools(python: str | os.PathLike[str] | None = None) -> Tools:
    """Locate nvcc and the disassemblers (on PATH or in the probe's packages)."""
    interpreter = Path(python) if python else Path(sys.executable)
    nvcc = require_nvcc(fix="install the CUDA toolkit (nvcc >= 12.9 for sm_120a/sm_120f)")
    paths: list[str] = probe(interpreter, _SYS_PATH_PROBE, what=f"{interpreter}")
    tools = Tools(python=interpreter, nvcc=nvcc.path, nvcc_version=nvcc.version_text,
                  cuobjdump=_tool("cuobjdump", paths), nvdisasm=_tool("nvdisasm", paths))
    if not tools.can_disassemble:
        log.warning("cuobjdump/nvdisasm not found: PDL instructions will be 'not checked' "
                    "(pip install --group proof into %s)", interpreter)
    return tools


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Mangled -> demangled C++ names (identity where c++filt is unavailable)."""
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None or not names:
        return {n: n for n in names}
    out = proc.run([cxxfilt], quiet=True, input="\n".join(names) + "\n").stdout.splitlines()
    if len(out) != len(names):
        raise VerifyError("c++filt returned a different number of names", where=cxxfilt)
    return dict(zip(names, out, strict=True))


def find_cuobjdump() -> Path:
    """cuobjdump on PATH, else the one pip's ``nvidia-cuda-cuobjdump`` installs."""
    hit = _tool("cuobjdump", sys.path, _PIP_TOOLS[:1])
    if hit is not None:
        return hit
    raise ConfigError("cuobjdump not found", fix="pip install nvidia-cuda-cuobjdump "
                      "(or put the CUDA toolkit's bin/ on PATH)")


#: A kernel body at most this large is "empty" when its sm_90a body is large.
EMPTY_BODY_BYTES = 256
#: ... and so is one smaller than this fraction of its sm_90a body.
EMPTY_BODY_FRACTION = 0.10
#: An sm_90a body must exceed this to call its SM12x counterpart empty.
LARGE_BODY_BYTES = 4 * EMPTY_BODY_BYTES

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_ELF_SECTION = struct.Struct("<IIQQQQIIQQ")
_ELF_SYMBOL = struct.Struct("<IBBHQQ")
_SHT_SYMTAB = 2
_SHN_UNDEF = 0


class ElfSection(NamedTuple):
    name: str
    type: int
    offset: int
    size: int
    link: int = 0
    entsize: int = 0


def parse_elf_sections(data: bytes, *, where: str = "<bytes>") -> tuple[ElfSection, ...]:
    """Section headers of a little-endian ELF64 file (cubins and x86-64 objects are)."""
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
    names = data[raw[shstrndx][4]:raw[shstrndx][4] + raw[shstrndx][5]]
    return tuple(ElfSection(name=_name_at(names, r[0]), type=r[1], offset=r[4], size=r[5],
                            link=r[6], entsize=r[9]) for r in raw)


def _name_at(table: bytes, index: int) -> str:
    end = table.find(b"\0", index)
    return table[index:end if end >= 0 else len(table)].decode("utf-8", "replace")


def undefined_symbols(data: bytes, *, where: str = "<bytes>") -> frozenset[str]:
    """Names an object file references but does not define (what it calls elsewhere)."""
    sections = parse_elf_sections(data, where=where)
    found: set[str] = set()
    for section in sections:
        if section.type != _SHT_SYMTAB:
            continue
        if section.entsize != _ELF_SYMBOL.size or section.link >= len(sections):
            raise VerifyError("malformed symbol table", where=where)
        strtab = sections[section.link]
        names = data[strtab.offset:strtab.offset + strtab.size]
        for start in range(section.offset, section.offset + section.size, _ELF_SYMBOL.size):
            st_name, _, _, st_shndx, _, _ = _ELF_SYMBOL.unpack_from(data, start)
            if st_shndx == _SHN_UNDEF and st_name:
                found.add(_name_at(names, st_name))
    return frozenset(found)


#: What the proof keeps of a host object's undefined symbols: the CUDA runtime API calls.
def runtime_calls(host_object: Path) -> tuple[str, ...]:
    symbols = undefined_symbols(host_object.read_bytes(), where=str(host_object))
    return tuple(sorted(s for s in symbols if s.startswith("cuda")))


def kernel_sizes(cubin: Path) -> dict[str, int]:
    """Mangled kernel name -> bytes of SASS (its ``.text.<name>`` section, which holds its
    non-inlined device functions too)."""
    sections = parse_elf_sections(cubin.read_bytes(), where=str(cubin))
    return {
        s.name.removeprefix(".text."): s.size for s in sections if s.name.startswith(".text.")
    }


def kernel_family(demangled: str) -> str:
    """The template (or function) a kernel instantiates: qualified name, no arguments."""
    return re.split(r"[<(]", demangled.removeprefix("void "), maxsplit=1)[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PdlOpcodes:
    """SASS opcodes that ``griddepcontrol.wait`` / ``.launch_dependents`` become on ``arch``."""

    arch: str
    wait: tuple[str, ...]
    launch: tuple[str, ...]


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

_SASS_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def parse_sass_opcodes(sass: str) -> dict[str, Counter[str]]:
    """``cuobjdump -sass`` text -> per function, how often each base opcode occurs."""
    per_function: dict[str, Counter[str]] = {}
    current: Counter[str] | None = None
    for line in sass.splitlines():
        if function := _SASS_FUNCTION.match(line):
            current = per_function.setdefault(function.group(1), Counter())
        elif (instruction := _SASS_INSTRUCTION.match(line)) and current is not None:
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


def pdl_counts(cubin: Path, opcodes: PdlOpcodes, tools: Tools) -> dict[str, tuple[int, int]]:
    """Per kernel, its PDL wait / launch instruction counts, kept beside the cubin keyed by
    the opcodes (disassembling ~900 kernels takes tens of seconds)."""
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kernel:
    name: str
    display: str
    family: str
    size: int
    pdl_wait: int | None = None
    pdl_launch: int | None = None


def inspect_cubin(cubin: Path, tools: Tools, opcodes: PdlOpcodes | None,
                  names: Mapping[str, str]) -> tuple[Kernel, ...]:
    counts = pdl_counts(cubin, opcodes, tools) if opcodes is not None else None
    kernels = []
    for name, size in sorted(kernel_sizes(cubin).items()):
        wait, launch = (None, None) if counts is None else counts.get(name, (0, 0))
        display = names.get(name, name)
        kernels.append(Kernel(name=name, display=display, family=kernel_family(display),
                              size=size, pdl_wait=wait, pdl_launch=launch))
    return tuple(kernels)


def is_empty_body(size: int, reference_size: int) -> bool:
    """A body that shrank to (almost) nothing against a large sm_90a body."""
    return reference_size > LARGE_BODY_BYTES and (
        size <= EMPTY_BODY_BYTES or size < EMPTY_BODY_FRACTION * reference_size)


def missing_and_empty(reference: Mapping[str, int], sizes: Mapping[str, int]
                      ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The proof's per-kernel rule, on kernel name -> SASS bytes: the ``reference`` (sm_90a)
    kernels that ``sizes`` lacks, and those whose body there is empty."""
    missing = tuple(sorted(set(reference) - set(sizes)))
    empty = tuple(sorted(name for name, size in reference.items()
                         if name in sizes and is_empty_body(sizes[name], size)))
    return missing, empty


def family_rows(columns: Sequence[Iterable[tuple[str, int, Iterable[str]]]]
                ) -> list[list[str]]:
    """Per kernel family, per column (its kernels as family, SASS bytes and what is wrong
    with each): ``count / min B / median B`` (``-``: none), then the wrongs counted."""
    cells: dict[str, list[tuple[list[int], Counter[str]]]] = defaultdict(
        lambda: [([], Counter()) for _ in columns])
    for index, column in enumerate(columns):
        for family, size, wrongs in column:
            cells[family][index][0].append(size)
            cells[family][index][1].update(wrongs)
    rows = []
    for family in sorted(cells):
        row = [f"`{family}`"]
        for sizes, wrongs in cells[family]:
            cell = f"{len(sizes)} / {min(sizes)} / {statistics.median(sizes):.0f}" if sizes else "-"
            notes = ", ".join(f"{count} {what}" for what, count in sorted(wrongs.items()))
            row.append(cell + (f" ({notes})" if notes else ""))
        rows.append(row)
    return rows
