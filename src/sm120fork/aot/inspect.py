"""What machine code a prebuilt module carries, judged by the SM12x proof's own rules:
every sm_90a kernel present in every other target, with a body that is not empty."""

from __future__ import annotations

import dataclasses
import re
import shutil
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from sm120fork.cuda import cubin
from sm120fork.cuda.arch import REFERENCE_ARCH
from sm120fork.cuda.tools import demangle, find_cuobjdump
from sm120fork.errors import VerifyError
from sm120fork.util import proc

_ELF_LINE = re.compile(r"^ELF file\s+\d+:\s+(\S+\.cubin)\s*$")
_CUBIN_TARGET = re.compile(r"\.(sm_\d+[a-z]?)\.cubin$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetCode:
    """One embedded cubin: its target and each kernel's SASS size."""

    target: str
    cubin: str
    kernels: dict[str, int]
    families: dict[str, str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetCheck:
    target: str
    reference_kernels: int
    present: int
    missing: tuple[str, ...]
    empty: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.reference_kernels > 0 and not self.missing and not self.empty


def embedded_code(so: Path) -> list[TargetCode]:
    """Every ELF cubin inside ``so`` (via ``cuobjdump -xelf all``), measured."""
    tool = find_cuobjdump()
    listing = proc.run([tool, "--list-elf", so], quiet=True).stdout
    names = [m.group(1) for line in listing.splitlines() if (m := _ELF_LINE.match(line.strip()))]
    if not names:
        raise VerifyError("no embedded cubins", where=str(so),
                          fix="the module was built without -gencode targets")
    # One cubin per translation unit and target: a target's kernels are their union.
    kernels: dict[str, dict[str, int]] = {}
    cubins: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="sm120fork-aot-elf-") as tmp:
        proc.run([tool, "-xelf", "all", so.resolve()], cwd=Path(tmp), quiet=True)
        for name in names:
            match = _CUBIN_TARGET.search(name)
            target = match.group(1) if match else name
            kernels.setdefault(target, {}).update(cubin.kernel_sizes(Path(tmp) / name))
            cubins.setdefault(target, []).append(name)
    cxxfilt = shutil.which("c++filt")
    out: list[TargetCode] = []
    for target, sizes in kernels.items():
        demangled = demangle(sorted(sizes), Path(cxxfilt) if cxxfilt else None)
        out.append(TargetCode(target=target, cubin=", ".join(cubins[target]), kernels=sizes,
                              families={k: cubin.kernel_family(demangled[k]) for k in sizes}))
    return out


def check_against(reference: TargetCode, other: TargetCode) -> TargetCheck:
    """The proof's per-kernel rule: present, and not an empty body against sm_90a."""
    missing = tuple(sorted(set(reference.kernels) - set(other.kernels)))
    empty = tuple(sorted(
        name for name, size in reference.kernels.items()
        if name in other.kernels and cubin.is_empty_body(other.kernels[name], size)))
    return TargetCheck(target=other.target, reference_kernels=len(reference.kernels),
                       present=len(reference.kernels) - len(missing), missing=missing,
                       empty=empty)


def check_module(code: Sequence[TargetCode]) -> list[TargetCheck]:
    reference = next((c for c in code if c.target == REFERENCE_ARCH), None)
    if reference is None:
        raise VerifyError(f"no {REFERENCE_ARCH} code to compare against",
                          fix=f"build the module for {REFERENCE_ARCH} too")
    return [check_against(reference, c) for c in code if c is not reference]


def family_rows(code: Sequence[TargetCode]) -> list[list[str]]:
    """Per kernel family and target: ``count / min B / median B``."""
    sizes: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for c in code:
        for name, size in c.kernels.items():
            sizes[c.families[name]][c.target].append(size)
    rows = []
    for family in sorted(sizes):
        row = [f"`{family}`"]
        for c in code:
            found = sizes[family].get(c.target, [])
            row.append(f"{len(found)} / {min(found)} / {statistics.median(found):.0f}"
                       if found else "-")
        rows.append(row)
    return rows


def summary(code: Sequence[TargetCode], checks: Sequence[TargetCheck]) -> dict[str, object]:
    return {
        "targets": [{"target": c.target, "cubin": c.cubin, "kernels": len(c.kernels),
                     "sass_bytes": sum(c.kernels.values())} for c in code],
        "checks": [{"target": k.target, "ok": k.ok, "reference_kernels": k.reference_kernels,
                    "present": k.present, "missing": len(k.missing), "empty": len(k.empty),
                    "first_empty": list(k.empty[:5])} for k in checks],
    }
