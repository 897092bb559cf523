"""The proof's compiles, cached under a content hash of the source, every header ``nvcc
-M`` reports, the flags and the compiler's version."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sm120fork.cuda.tools import Tools
from sm120fork.errors import VerifyError
from sm120fork.util import proc
from sm120fork.util.files import sha256_file

log = logging.getLogger("sm120fork")

def make_dependencies(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    _, _, deps = joined.partition(": ")
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


def cubin_path(cache: Path, key: str) -> Path:
    return cache / f"{key}.cubin"


def host_object_path(cache: Path, key: str) -> Path:
    return cache / f"{key}.o"


def compile_job(job: Job, cache: Path) -> float:
    log.info("compiling %s for %s%s", job.source, job.arch, " (+ host object)" if job.host else "")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sm120fork-proof-nvcc-", dir=cache) as scratch:
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
    """Seconds of the run that made ``job``'s cached outputs; None if any is missing."""
    meta = cache / f"{job.key}.json"
    if not cubin_path(cache, job.key).exists() or not meta.exists():
        return None
    if job.host and not host_object_path(cache, job.key).exists():
        return None
    seconds: float = json.loads(meta.read_text())["seconds"]
    return seconds
