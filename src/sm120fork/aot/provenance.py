"""The sources digest our patched FlashInfer asks of a prebuilt module before loading it
(patches/sglang-0.5.10/flashinfer/README-prebuilt.md); the tree's own implementation,
``flashinfer/jit/provenance.py``, is used where it has one and must agree."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from sm120fork.errors import BuildError

MARKER_SUFFIX = ".sources"
_IMPLEMENTATION = Path("flashinfer") / "jit" / "provenance.py"


def own_digest(csrc: Path, include: Path) -> str:
    """The rule, computed here: ``sha256:<hex>`` over csrc/ and include/."""
    lines: list[tuple[str, str]] = []
    for base in (csrc, include):
        for path in base.rglob("*"):
            if path.is_file():
                rel = f"{base.name}/{path.relative_to(base).as_posix()}"
                lines.append((rel, hashlib.sha256(path.read_bytes()).hexdigest()))
    digest = hashlib.sha256()
    for rel, file_digest in sorted(lines):
        digest.update(f"{rel}\0{file_digest}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def tree_digest(tree: Path) -> tuple[str, str]:
    """(digest, how) for a FlashInfer source tree (or a published wheel, unpacked: its
    ``flashinfer/data/``): its own provenance.py where it has one."""
    root = tree / "flashinfer" / "data" if not (tree / "csrc").is_dir() else tree
    csrc, include = root / "csrc", root / "include"
    mine = own_digest(csrc, include)
    implementation = tree / _IMPLEMENTATION
    if not implementation.is_file():
        return mine, "sm120fork (the tree has no flashinfer/jit/provenance.py)"
    spec = importlib.util.spec_from_file_location("_flashinfer_provenance", implementation)
    if spec is None or spec.loader is None:
        raise BuildError("cannot load the tree's provenance.py", where=str(implementation))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    theirs = str(module.sources_digest(csrc, include))
    if theirs != mine:
        raise BuildError(f"the tree's sources digest {theirs} differs from the rule's {mine}",
                         where=str(implementation),
                         fix="align sm120fork.aot.provenance with README-prebuilt.md")
    return theirs, "flashinfer/jit/provenance.py"

