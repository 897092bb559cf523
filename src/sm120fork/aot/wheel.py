"""The AOT wheel: our prebuilt modules in a distribution of their own (taking upstream's
jit-cache name would make pip uninstall it), found through an entry point by a lookup read
from FlashInfer's sources (:data:`LOOKUPS`).  It requires exactly the FlashInfer wheel it was
built from; its ``manifest.json`` records that wheel, the fork tree, each module's sha256 and
sources marker (patches/sglang-0.5.10/flashinfer/README-prebuilt.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.tags import Tag
from packaging.version import Version
from wheel.wheelfile import WheelFile

from sm120fork.errors import BuildError, ConfigError
from sm120fork.manifest import ManifestEntry
from sm120fork.package.wheel import wheel_metadata
from sm120fork.util import typed
from sm120fork.util.files import scratch_prefix, sha256_file
from sm120fork.util.hint import command


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lookup:
    """One way a FlashInfer finds our prebuilt modules."""

    name: str
    #: The entry point group the AOT wheel registers in.
    group: str
    #: The function of the AOT wheel's package that the entry point names.
    function: str
    #: Text of ``flashinfer/jit/env.py`` that shows this FlashInfer has the lookup.
    evidence: str
    #: Distribution FlashInfer asks through (``None``: FlashInfer reads the group itself);
    #: the AOT wheel requires it at exactly its own version.
    through: str | None = None
    #: Where ``through`` is published when that is not the default index.
    through_index: str | None = None


#: The default stack's series (patch 0009 of patches/sglang-0.5.10/flashinfer).
PREBUILT = Lookup(name="prebuilt", group="flashinfer.prebuilt", function="get_jit_cache_dir",
                  evidence='"flashinfer.prebuilt"')
#: FlashInfer 0.7.x as published, through upstream's shim (its
#: JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP and schema version 1).
JIT_CACHE_PROVIDERS = Lookup(
    name="jit-cache-providers", group="flashinfer.jit_cache.providers",
    function="get_provider", evidence="get_jit_cache_providers()",
    through="flashinfer-jit-cache", through_index="https://flashinfer.ai/whl/cu{cuda}")
PROVIDER_SCHEMA_VERSION = 1

#: In the order they are tried: a FlashInfer with our lookup uses it.
LOOKUPS: tuple[Lookup, ...] = (PREBUILT, JIT_CACHE_PROVIDERS)


def of_tree(tree: Path, stack: str) -> Lookup:
    """The lookup of the FlashInfer sources at ``tree``; refuses one that has none."""
    env = tree / "flashinfer" / "jit" / "env.py"
    try:
        text = env.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("the FlashInfer sources have no readable flashinfer/jit/env.py",
                          where=str(env)) from exc
    found = next((lookup for lookup in LOOKUPS if lookup.evidence in text), None)
    if found is None:
        groups = " or ".join(lookup.group for lookup in LOOKUPS)
        raise ConfigError(
            f"stack {stack}'s FlashInfer has no lookup for prebuilt-module packages (entry "
            f"point group {groups}): it would never load the AOT wheel's module",
            where=str(env),
            fix="add the lookup to the stack's FlashInfer series (patch 0009 of "
                "patches/sglang-0.5.10/flashinfer), or JIT-compile with nvcc >= 12.9")
    return found


MARKER_SUFFIX = ".sources"
_IMPLEMENTATION = Path("flashinfer") / "jit" / "provenance.py"


def own_digest(csrc: Path, include: Path) -> str:
    """The rule, computed here: ``sha256:<hex>`` over csrc/ and include/."""
    files = sorted((f"{base.name}/{path.relative_to(base).as_posix()}",
                    hashlib.sha256(path.read_bytes()).hexdigest())
                   for base in (csrc, include) for path in base.rglob("*") if path.is_file())
    text = "".join(f"{rel}\0{file_digest}\n" for rel, file_digest in files)
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"


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
                         fix="align sm120fork.aot.wheel.own_digest with README-prebuilt.md")
    return theirs, "flashinfer/jit/provenance.py"


DISTRIBUTION = "sm120fork-flashinfer-aot"
PACKAGE = "sm120fork_flashinfer_aot"
CACHE_DIR = "jit_cache"
#: The entry point's name in either group: also the provider id FlashInfer 0.7.x reports.
ENTRY_POINT_NAME = "sm120fork"
MANIFEST = "manifest.json"
#: Set in the package so that a program can tell our build from upstream's.
BUILDER = "sm120fork"

_FIXED_ZIP_TIME = (2000, 1, 1, 0, 0, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlashInferBuild:
    """The FlashInfer wheel the modules were compiled for (from the stack's manifest)."""

    distribution: str
    version: str
    wheel: str
    sha256: str
    #: The fork tree's git tree hash and patched commit; ``None`` for a FlashInfer the stack
    #: ships as published (its sources are the published wheel, pinned by ``sha256``).
    tree: str | None
    patched_commit: str | None
    upstream_version: str
    series_digest: str

    @classmethod
    def from_manifest(cls, entry: ManifestEntry, *, where: str) -> FlashInferBuild:
        if not entry.used_as_published and (entry.tree is None or entry.patched_commit is None):
            raise ConfigError("manifest entry lacks its patched tree", where=where,
                              fix=f"rebuild the stack: {command('build')}")
        return cls(**{f.name: getattr(entry, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Module:
    """One prebuilt module file for the wheel."""

    name: str
    so: Path
    targets: tuple[str, ...]
    info: Mapping[str, Any]
    #: ``sha256:<hex>`` of the C++ sources it was built from: the marker our FlashInfer
    #: checks before loading it (patches/<stack>/flashinfer/README-prebuilt.md).
    sources_digest: str


def cuda_tag(cuda_version: str) -> str:
    """``13.0`` -> ``cu130``, FlashInfer's own suffix for its jit-cache wheels."""
    match = re.fullmatch(r"(\d+)\.(\d+)", cuda_version)
    if not match:
        raise ConfigError(f"not a CUDA version: {cuda_version!r}")
    return f"cu{match.group(1)}{match.group(2)}"


def wheel_version(flashinfer_version: str, cuda_version: str) -> str:
    """FlashInfer's full version with the CUDA tag appended to its local label (upstream's
    import-time check asks the full version of a jit-cache, patch 0001 the public part)."""
    version = Version(flashinfer_version)
    tag = cuda_tag(cuda_version)
    return f"{version}.{tag}" if version.local else f"{version}+{tag}"


#: What a module compiled with CUDA <major> needs at run time besides the driver: the
#: runtime library it links (``libcudart.so.<major>``), as the package index ships it, and
#: where that package puts it in site-packages.  Not every stack's torch brings it (torch
#: 2.9.1 from the index is CUDA 12.8).
CUDA_RUNTIMES: dict[str, tuple[str, str]] = {
    "12": ("nvidia-cuda-runtime-cu12>=12.9", "nvidia/cuda_runtime/lib"),
    "13": ("nvidia-cuda-runtime>=13.0,<14", "nvidia/cu13/lib"),
}


def _init_py(version: str, flashinfer: FlashInferBuild, cuda_version: str, lookup: Lookup,
             modules: Sequence[Module]) -> str:
    major = cuda_version.split(".", 1)[0]
    # nvcc targets (sm_120f) as FlashInfer's providers name them (sm120f)
    architectures = sorted({t.replace("_", "") for m in modules for t in m.targets})
    return f'''"""Prebuilt FlashInfer modules built by {BUILDER} for {flashinfer.distribution} \
{flashinfer.version}.

{_how_found(lookup)} instead of
JIT-compiling it.  ``manifest()`` says what was built, from which sources, for which GPUs.
The modules link the CUDA {major} runtime (``libcudart.so.{major}``); where torch did not
load it (a torch built for another CUDA), ``get_jit_cache_dir()`` loads it from the
package this wheel requires, so FlashInfer can load the modules.
"""

import ctypes as _ctypes
import json as _json
import pathlib as _pathlib

__version__ = "{version}"
BUILT_BY = "{BUILDER}"
FLASHINFER_VERSION = "{flashinfer.version}"
FLASHINFER_WHEEL_SHA256 = "{flashinfer.sha256}"
CUDA_RUNTIME = "libcudart.so.{major}"

_HERE = _pathlib.Path(__file__).resolve().parent


def load_cuda_runtime():
    """Load {{CUDA_RUNTIME}} (already loaded, on the search path, or from site-packages);
    returns where from, or None when it is nowhere (the modules then cannot load)."""
    try:
        _ctypes.CDLL(CUDA_RUNTIME, mode=_ctypes.RTLD_GLOBAL)
        return CUDA_RUNTIME
    except OSError:
        pass
    candidate = _HERE.parent / "{CUDA_RUNTIMES[major][1]}" / CUDA_RUNTIME
    try:
        _ctypes.CDLL(str(candidate), mode=_ctypes.RTLD_GLOBAL)
        return str(candidate)
    except OSError:
        return None


def get_jit_cache_dir() -> str:
    load_cuda_runtime()
    return str(_HERE / "{CACHE_DIR}")


def manifest() -> dict:
    return _json.loads((_HERE / "{MANIFEST}").read_text())
{"" if lookup is PREBUILT else _provider_py(architectures, modules)}'''


def _how_found(lookup: Lookup) -> str:
    if lookup is PREBUILT:  # the default stack's wheel keeps its bytes
        return (f"Our FlashInfer finds this folder through the entry point ``{lookup.group}``\n"
                f"``{ENTRY_POINT_NAME}`` and loads ``<get_jit_cache_dir()>/<module>/<module>.so``")
    return (f"FlashInfer finds this folder through the entry point ``{lookup.group}``\n"
            f"``{ENTRY_POINT_NAME}`` (``{lookup.function}()``, asked by "
            f"{lookup.through or 'FlashInfer'}) and loads\n"
            "``<get_jit_cache_dir()>/<module>/<module>.so``")


def _provider_py(architectures: Sequence[str], modules: Sequence[Module]) -> str:
    return f'''

def get_provider() -> dict:
    """This wheel as a provider of FlashInfer's jit-cache shim (manifest schema \\
{PROVIDER_SCHEMA_VERSION})."""
    return {{"schema_version": {PROVIDER_SCHEMA_VERSION}, "provider_id": "{ENTRY_POINT_NAME}",
            "distribution": "{DISTRIBUTION}",
            "version": __version__, "jit_cache_dir": get_jit_cache_dir(),
            "cuda_architectures": {list(architectures)!r},
            "modules": {[m.name for m in modules]!r}}}
'''


def _metadata(version: str, flashinfer: FlashInferBuild, requires: Sequence[str]) -> str:
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {DISTRIBUTION}",
        f"Version: {version}",
        f"Summary: Prebuilt FlashInfer trtllm comm module (SM90, SM10x, SM12x) for "
        f"{flashinfer.distribution} {flashinfer.version}, built by {BUILDER}",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        *(f"Requires-Dist: {r}" for r in requires),
        "", ""])


def write_wheel(out_dir: Path, *, flashinfer: FlashInferBuild, modules: Sequence[Module],
                cuda_version: str, platform: str, stack: str, toolkit_version: str,
                toolchain: Mapping[str, Any], lookup: Lookup = PREBUILT) -> Path:
    """Write the wheel into ``out_dir``; returns its path.  Byte-stable for equal inputs."""
    if not modules:
        raise BuildError("no prebuilt modules to put into the AOT wheel")
    version = wheel_version(flashinfer.version, cuda_version)
    runtime = CUDA_RUNTIMES.get(cuda_version.split(".", 1)[0])
    if runtime is None:
        raise ConfigError(f"no runtime requirement known for CUDA {cuda_version}",
                          fix="add it to sm120fork.aot.wheel.CUDA_RUNTIMES")
    # what FlashInfer asks through to find the wheel, at exactly the wheel's version
    through = () if lookup.through is None else (f"{lookup.through}=={version}",)
    requires = [f"{flashinfer.distribution}=={flashinfer.version}", *through, runtime[0]]
    tag = Tag("py3", "none", platform)
    dist_info = f"{PACKAGE}-{version}.dist-info"
    entry_point = f"{ENTRY_POINT_NAME} = {PACKAGE}:{lookup.function}"
    wheel_file = f"Wheel-Version: 1.0\nGenerator: {BUILDER}\nRoot-Is-Purelib: false\nTag: {tag}\n\n"
    manifest = {
        "distribution": DISTRIBUTION, "version": version, "built_by": BUILDER,
        "toolkit_version": toolkit_version, "stack": stack,
        "flashinfer": dataclasses.asdict(flashinfer),
        "toolchain": dict(toolchain),
        "modules": {m.name: {"path": f"{CACHE_DIR}/{m.name}/{m.name}.so",
                             "sha256": sha256_file(m.so), "bytes": m.so.stat().st_size,
                             "targets": list(m.targets), "sources_digest": m.sources_digest,
                             "marker": f"{CACHE_DIR}/{m.name}/{m.name}.so.sources",
                             **dict(m.info)}
                    for m in modules},
        "requires": requires,
    }
    if lookup is not PREBUILT:  # the default stack's wheel keeps its bytes
        manifest["lookup"] = {"name": lookup.name, "group": lookup.group,
                              "entry_point": entry_point,
                              "through": lookup.through}
    files: list[tuple[str, bytes, int]] = [
        (f"{PACKAGE}/__init__.py",
         _init_py(version, flashinfer, cuda_version, lookup, modules).encode(), 0o644),
        (f"{PACKAGE}/{MANIFEST}", (json.dumps(manifest, indent=1, sort_keys=True)
                                   + "\n").encode(), 0o644),
    ]
    for m in modules:
        base = f"{PACKAGE}/{CACHE_DIR}/{m.name}/{m.name}.so"
        files += [(base, m.so.read_bytes(), 0o755),
                  (base + ".sources", f"{m.sources_digest}\n".encode(), 0o644)]
    files += [(f"{dist_info}/METADATA", _metadata(version, flashinfer, requires).encode(),
               0o644),
              (f"{dist_info}/entry_points.txt", f"[{lookup.group}]\n{entry_point}\n".encode(),
               0o644),
              (f"{dist_info}/WHEEL", wheel_file.encode(), 0o644)]
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{PACKAGE}-{version}-{tag}.whl"
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("aot-wheel"), dir=out_dir) as tmp:
        staged = Path(tmp) / target.name  # WheelFile reads the name and version from it
        with _ReproducibleWheelFile(staged, "w", compression=zipfile.ZIP_DEFLATED) as wf:
            for path, data, mode in files:
                wf.writestr(_zip_info(path, mode), data)
        staged.replace(target)
    return target


def publish(wheel: Path, folder: Path) -> Path:
    """``wheel`` copied into ``folder`` as its one AOT wheel (an older one removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f"{PACKAGE}-*.whl"):
        stale.unlink()
    return Path(shutil.copy2(wheel, folder / wheel.name))


def _zip_info(path: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(path, date_time=_FIXED_ZIP_TIME)
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


class _ReproducibleWheelFile(WheelFile):  # type: ignore[misc]  # WheelFile is untyped
    """``wheel``'s WheelFile (it writes RECORD on close), with RECORD dated and permissioned
    like every other member, whatever the clock or SOURCE_DATE_EPOCH."""

    def writestr(self, zinfo_or_arcname: str | zipfile.ZipInfo, data: Any,
                 compress_type: int | None = None) -> None:
        if isinstance(zinfo_or_arcname, str):  # RECORD, from close()
            zinfo_or_arcname = _zip_info(zinfo_or_arcname, 0o644)
        super().writestr(zinfo_or_arcname, data, compress_type)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AotModule:
    """One prebuilt module as the wheel's manifest records it."""

    #: The ``.so`` and its sources marker, relative to the package.
    path: str
    marker: str
    sha256: str
    sources_digest: str
    targets: tuple[str, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AotLookup:
    """How the FlashInfer the wheel pins finds it (absent from the manifest: ``prebuilt``)."""

    name: str = PREBUILT.name
    group: str = PREBUILT.group
    through: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class AotManifest:
    """``manifest.json`` inside an AOT wheel: its one typed reader (:func:`read_wheel`);
    :func:`write_wheel` writes it."""

    version: str
    flashinfer: FlashInferBuild
    modules: Mapping[str, AotModule]
    lookup: AotLookup = AotLookup()


def read_wheel(path: Path) -> AotManifest:
    """The manifest inside an AOT wheel, checked against the files beside it (BuildError)."""
    where = f"{path}:{PACKAGE}/{MANIFEST}"
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        try:
            manifest = typed.read(AotManifest, json.loads(zf.read(f"{PACKAGE}/{MANIFEST}")),
                                  where, strict=False)
        except typed.MalformedError as exc:
            raise BuildError(f"not an AOT wheel's manifest: {exc.key}: {exc.what}", where=where,
                             fix="rebuild the AOT wheel with this toolkit") from None
        for module, entry in manifest.modules.items():
            member = f"{PACKAGE}/{entry.path}"
            if member not in names:
                raise BuildError(f"module {module} missing from the wheel", where=str(path))
            if hashlib.sha256(zf.read(member)).hexdigest() != entry.sha256:
                raise BuildError(f"module {module} does not match its sha256",
                                 where=f"{path}:{member}")
            marker = f"{PACKAGE}/{entry.marker}"
            if marker not in names or zf.read(marker).decode().strip() != \
                    entry.sources_digest:
                raise BuildError(f"module {module}'s sources marker is missing or differs "
                                 "from the manifest", where=f"{path}:{marker}")
    if wheel_metadata(path)["Version"] != manifest.version:
        raise BuildError("METADATA and manifest.json disagree on the version", where=str(path))
    return manifest
