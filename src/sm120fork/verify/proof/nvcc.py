"""The proof's programs (nvcc, c++filt, the disassemblers) and its cached compiles.

Cubins (and, where asked, host objects) are cached under a content hash of everything that
went into them: the source, every header ``nvcc -M`` reports, the flags and the compiler's
version, so re-runs and variants sharing their C++ sources cost nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sm120fork.errors import VerifyError
from sm120fork.util import proc

log = logging.getLogger("sm120fork")

PROBE_MARK = "@@sm120proof@@"

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


def require_tools_in_ci(tools: Tools) -> None:
    """On CI (``CI=true``) a missing disassembler is an error, not a degraded check."""
    if os.environ.get("CI", "").lower() == "true" and not tools.can_disassemble:
        raise VerifyError("cuobjdump/nvdisasm not found and CI=true",
                          where=str(tools.python),
                          fix="pip install --group proof (pyproject.toml)")


def find_tools(python: str | os.PathLike[str] | None = None) -> Tools:
    """Locate nvcc, c++filt and the disassemblers (on PATH or in the probe's packages)."""
    interpreter = Path(python) if python else Path(sys.executable)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise VerifyError("nvcc not found on PATH",
                          fix="install the CUDA toolkit (nvcc >= 12.9 for sm_120a/sm_120f)")
    version = proc.run([nvcc, "--version"], quiet=True).stdout.strip().splitlines()[-1]
    located: dict[str, str] = {}
    out = proc.run([interpreter, "-c", _LOCATE_PROBE, PROBE_MARK], quiet=True).stdout
    for line in out.splitlines():
        if line.startswith(PROBE_MARK):
            located = json.loads(line.removeprefix(PROBE_MARK))

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


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def make_dependencies(text: str) -> list[str]:
    """The prerequisites of a make rule as ``nvcc -M`` prints it."""
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
    for dep in sorted(set(make_dependencies(deps))):
        path = Path(dep).resolve()
        shown = path.as_posix().replace(root, "<tree>")
        digest.update(f"\0{shown}\0{_file_digest(path)}".encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """One translation unit for one architecture; ``host``: keep the host object too."""

    key: str
    arch: str
    source: str
    argv: tuple[str, ...]
    host: bool = False


def cubin_path(cache: Path, key: str) -> Path:
    return cache / f"{key}.cubin"


def host_object_path(cache: Path, key: str) -> Path:
    return cache / f"{key}.o"


def compile_job(job: Job, cache: Path) -> float:
    """Run the job's nvcc; its cubin (and host object) land in ``cache`` atomically."""
    log.info("compiling %s for %s%s", job.source, job.arch, " (+ host object)" if job.host else "")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sm120proof-nvcc-", dir=cache) as scratch:
        work = Path(scratch)
        if job.host:
            # One nvcc run gives both: the object, and the cubin it embeds (kept).
            proc.run([*job.argv, "-c", "--keep", "--keep-dir", str(work), "-o",
                      str(work / "unit.o")])
            cubins = sorted(work.glob("*.cubin"))
            if len(cubins) != 1:
                raise VerifyError(f"expected one kept cubin, found {[c.name for c in cubins]}",
                                  where=job.source)
            (work / "unit.o").replace(host_object_path(cache, job.key))
            cubins[0].replace(cubin_path(cache, job.key))
        else:
            proc.run([*job.argv, "-cubin", "-o", str(work / "unit.cubin")])
            (work / "unit.cubin").replace(cubin_path(cache, job.key))
    seconds = time.perf_counter() - start
    meta = {"source": job.source, "arch": job.arch, "seconds": round(seconds, 2),
            "host": job.host, "argv": list(job.argv)}
    (cache / f"{job.key}.json").write_text(json.dumps(meta, indent=1) + "\n")
    log.info("compiled %s for %s in %.1f s", job.source, job.arch, seconds)
    return seconds


def cached_seconds(cache: Path, job: Job) -> float | None:
    """Seconds of the run that made the cached outputs ``job`` needs; None if any is missing."""
    meta = cache / f"{job.key}.json"
    if not cubin_path(cache, job.key).exists() or not meta.exists():
        return None
    if job.host and not host_object_path(cache, job.key).exists():
        return None
    seconds: float = json.loads(meta.read_text())["seconds"]
    return seconds
