"""What the package index serves: each stack's built, plugin and AOT wheels, checked
against their build's record, and only ours (a local label of the stack, ``+sm120.1``):
a public release served from here would go under our name."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from email.parser import BytesParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from sm120fork import manifest as manifest_file
from sm120fork.aot import wheel as aot_wheel
from sm120fork.aot.pipeline import default_out as aot_folder
from sm120fork.declare import Stack
from sm120fork.errors import ArtifactCheckError, ConfigError
from sm120fork.manifest import Manifest
from sm120fork.package.routes import Pin
from sm120fork.plugin.build import PLUGIN_DIR, PublishedPlugin
from sm120fork.util.files import sha256_file
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace


@dataclass(frozen=True, kw_only=True)
class Served:
    path: Path
    project: str
    version: Version
    sha256: str
    size: int
    metadata: bytes
    requires_python: str
    python: str
    torch: str
    cuda: str

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def pin(self) -> Pin:
        return Pin(distribution=self.project, version=str(self.version))


@dataclass(frozen=True, kw_only=True)
class StackWheels:
    stack: Stack
    manifest: Manifest
    plugin: PublishedPlugin | None
    served: tuple[Served, ...]
    aot: Served | None
    left_out: tuple[str, ...]


def _ours(stack: Stack, version: Version) -> bool:
    labels = {p.local_label for p in stack.projects}
    local = version.local or ""
    return any(local == label or local.startswith(f"{label}.") for label in labels)


_CUDA = ("cuda-python", "cuda-bindings")


def _needs(requirements: list[Requirement], version: Version) -> tuple[str, str]:
    """The torch and CUDA a wheel requires (Requires-Dist less extras; ``cuNNN`` labels)."""
    always = [r for r in requirements if r.marker is None or "extra" not in str(r.marker)]
    torch = [str(r.specifier) or "any" for r in always if canonicalize_name(r.name) == "torch"]
    cuda = [str(r) for r in always if canonicalize_name(r.name) in _CUDA
            or canonicalize_name(r.name).startswith("nvidia-cuda-")]
    cuda += [f"CUDA {p[2:-1]}.{p[-1]}" for p in (version.local or "").split(".")
             if p.startswith("cu") and p[2:].isdigit() and len(p) > 3]
    return (", ".join(torch) or "not required",
            ", ".join(sorted(cuda)) or "not pinned by the wheel")


def read_wheel(path: Path) -> Served:
    name, version, _, tags = parse_wheel_filename(path.name)
    try:
        with zipfile.ZipFile(path) as zf:
            found = [n for n in zf.namelist()
                     if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(found) != 1:
                raise ConfigError(f"{len(found)} top-level .dist-info/METADATA files",
                                  where=str(path), fix="rebuild the wheel")
            metadata = zf.read(found[0])
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"not a readable wheel: {exc}", where=str(path),
                          fix="rebuild the wheel") from exc
    meta = BytesParser().parsebytes(metadata, headersonly=True)
    requires_python = meta.get("Requires-Python", "")
    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    pythons = ", ".join(sorted({t.interpreter for t in tags}))
    torch, cuda = _needs(requirements, version)
    return Served(path=path, project=canonicalize_name(name), version=version,
                  sha256=sha256_file(path), size=path.stat().st_size, metadata=metadata,
                  requires_python=requires_python, torch=torch, cuda=cuda,
                  python=f"{requires_python or 'any'} ({pythons})")


def _checked(path: Path, sha256: str, stack: Stack) -> Served:
    if not path.is_file():
        raise ConfigError("a wheel its build recorded is missing", where=str(path),
                          fix=f"rebuild the stack: {command('build', '--stack', stack.name)}")
    served = read_wheel(path)
    if served.sha256 != sha256:
        raise ArtifactCheckError(
            f"sha256 {served.sha256[:12]}... differs from its build's record "
            f"({sha256[:12]}...)", where=str(path),
            fix=f"rebuild the stack: {command('build', '--stack', stack.name)}")
    return served


def stack_wheels(ws: Workspace, stack: Stack) -> StackWheels | None:
    folder = ws.stack_wheels(stack.name)
    if not (folder / manifest_file.FILE).is_file():
        return None
    manifest = manifest_file.read(folder)
    plugin = PublishedPlugin.read(folder)
    candidates = [_checked(folder / e.wheel, e.sha256, stack) for e in manifest.wheels]
    if plugin is not None:
        candidates.append(_checked(folder / PLUGIN_DIR / plugin.wheel, plugin.sha256, stack))
    aots = [read_wheel(p) for p in sorted(aot_folder(ws, stack).glob("*.whl"))]
    candidates += aots
    left = {w.filename: (
        f"version {w.version} has no local label of the stack "
        f"({', '.join(sorted({p.local_label for p in stack.projects}))}); not served, pip "
        "gets a public release from the public index") for w in candidates
        if not _ours(stack, w.version)}
    for w in (a for a in aots if a.filename not in left):
        built_for = aot_wheel.read_wheel(w.path).flashinfer
        if built_for.sha256 not in {e.sha256 for e in manifest.wheels}:
            left[w.filename] = (
                f"built for a FlashInfer wheel this build did not publish ({built_for.wheel}, "
                f"sha256 {built_for.sha256[:12]}...); not served: rebuild it with "
                f"`{command('build-aot', '--stack', stack.name)}`")
    served = tuple(w for w in candidates if w.filename not in left)
    left_out = tuple(f"{stack.name}: {name}: {why}" for name, why in left.items())
    aot = next((w for w in aots if w in served), None)
    if not any(w.filename == getattr(plugin, "wheel", None) for w in served):
        plugin = None
    return StackWheels(stack=stack, manifest=manifest, plugin=plugin,
                       served=served, aot=aot, left_out=left_out)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
