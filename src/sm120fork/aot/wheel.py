"""The AOT wheel: where FlashInfer 0.6.x looks for prebuilt modules, and what it pins.

FlashInfer 0.6.7.post3 (``flashinfer/jit/env.py`` ``_get_aot_dir``) loads prebuilt modules
from ``flashinfer_jit_cache.get_jit_cache_dir()`` when that package is importable, else from
``flashinfer/data/aot``; ``JitSpec.build_and_load`` takes ``<dir>/<name>/<name>.so`` when it
exists and JIT-compiles otherwise.  Upstream ships its prebuilt modules as the distribution
``flashinfer-jit-cache`` (version ``<flashinfer>+cu<NNN>``).

So the AOT wheel *is* a ``flashinfer-jit-cache`` distribution, with the version
``<our flashinfer version>.cu<NNN>`` (e.g. ``0.6.7.post3+sm120.1.cu130``): one distribution
name means pip never has ours and upstream's installed at once (installing one uninstalls
the other, and says so), neither can overwrite the other's files unnoticed, and
``flashinfer_jit_cache.__version__`` / ``pip list`` tell which one is in place.  It
requires exactly the FlashInfer wheel it was built from (``flashinfer-python==<version
with our local label>``), and its ``manifest.json`` records that wheel's sha256, the fork
tree and each module's sha256.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from sm120fork.errors import BuildError, ConfigError
from sm120fork.util.files import sha256_file

DISTRIBUTION = "flashinfer-jit-cache"
PACKAGE = "flashinfer_jit_cache"
CACHE_DIR = "jit_cache"
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
    tree: str
    patched_commit: str
    upstream_version: str
    series_digest: str

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any], *, where: str) -> FlashInferBuild:
        try:
            return cls(distribution=entry["distribution"], version=entry["version"],
                       wheel=entry["wheel"], sha256=entry["sha256"], tree=entry["tree"],
                       patched_commit=entry["patched_commit"],
                       upstream_version=entry["upstream_version"],
                       series_digest=entry["series_digest"])
        except KeyError as exc:
            raise ConfigError(f"manifest entry lacks {exc.args[0]!r}", where=where,
                              fix="rebuild the stack with `nox -s build`") from exc


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
    """Our FlashInfer version with the CUDA tag appended to its local label.

    It starts with FlashInfer's full version (what upstream's import-time check asks of a
    jit-cache), and its public part is FlashInfer's (what patch 0001's check asks).
    """
    version = Version(flashinfer_version)
    tag = cuda_tag(cuda_version)
    text = f"{version}.{tag}" if version.local else f"{version}+{tag}"
    try:
        Version(text)
    except InvalidVersion as exc:  # pragma: no cover - both parts were validated
        raise ConfigError(f"cannot form a version from {flashinfer_version!r}") from exc
    return text


def _init_py(version: str, flashinfer: FlashInferBuild) -> str:
    return f'''"""Prebuilt FlashInfer modules built by {BUILDER} for {flashinfer.distribution} \
{flashinfer.version}.

FlashInfer loads ``<get_jit_cache_dir()>/<module>/<module>.so`` instead of JIT-compiling it.
``manifest()`` says what was built, from which sources, for which GPUs.
"""

import json as _json
import pathlib as _pathlib

__version__ = "{version}"
BUILT_BY = "{BUILDER}"
FLASHINFER_VERSION = "{flashinfer.version}"
FLASHINFER_WHEEL_SHA256 = "{flashinfer.sha256}"

_HERE = _pathlib.Path(__file__).resolve().parent


def get_jit_cache_dir() -> str:
    return str(_HERE / "{CACHE_DIR}")


def manifest() -> dict:
    return _json.loads((_HERE / "{MANIFEST}").read_text())
'''


def _metadata(version: str, flashinfer: FlashInferBuild) -> str:
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {DISTRIBUTION}",
        f"Version: {version}",
        f"Summary: Prebuilt FlashInfer trtllm comm module (SM90, SM10x, SM12x) for "
        f"{flashinfer.distribution} {flashinfer.version}, built by {BUILDER}",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        f"Requires-Dist: {flashinfer.distribution}=={flashinfer.version}",
        "", ""])


def _wheel_file(tag: Tag) -> str:
    return "\n".join(["Wheel-Version: 1.0", f"Generator: {BUILDER}", "Root-Is-Purelib: false",
                      f"Tag: {tag}", "", ""])


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_manifest(*, version: str, flashinfer: FlashInferBuild, modules: Sequence[Module],
                   stack: str, toolkit_version: str, toolchain: Mapping[str, Any]
                   ) -> dict[str, Any]:
    return {
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
    }


def write_wheel(out_dir: Path, *, flashinfer: FlashInferBuild, modules: Sequence[Module],
                cuda_version: str, platform: str, stack: str, toolkit_version: str,
                toolchain: Mapping[str, Any]) -> Path:
    """Write the wheel into ``out_dir``; returns its path.  Byte-stable for equal inputs."""
    if not modules:
        raise BuildError("no prebuilt modules to put into the AOT wheel")
    version = wheel_version(flashinfer.version, cuda_version)
    tag = Tag("py3", "none", platform)
    name = canonicalize_name(DISTRIBUTION).replace("-", "_")
    dist_info = f"{name}-{version}.dist-info"
    manifest = build_manifest(version=version, flashinfer=flashinfer, modules=modules,
                              stack=stack, toolkit_version=toolkit_version,
                              toolchain=toolchain)
    files: list[tuple[str, bytes, int]] = [
        (f"{PACKAGE}/__init__.py", _init_py(version, flashinfer).encode(), 0o644),
        (f"{PACKAGE}/{MANIFEST}", (json.dumps(manifest, indent=1, sort_keys=True)
                                   + "\n").encode(), 0o644),
    ]
    for m in modules:
        base = f"{PACKAGE}/{CACHE_DIR}/{m.name}/{m.name}.so"
        files += [(base, m.so.read_bytes(), 0o755),
                  (base + ".sources", f"{m.sources_digest}\n".encode(), 0o644)]
    files += [(f"{dist_info}/METADATA", _metadata(version, flashinfer).encode(), 0o644),
              (f"{dist_info}/WHEEL", _wheel_file(tag).encode(), 0o644)]
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data, _ in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode(), 0o644))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}-{version}-{tag}.whl"
    tmp = target.with_suffix(".whl.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, data, mode in files:
            info = zipfile.ZipInfo(path, date_time=_FIXED_ZIP_TIME)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    tmp.replace(target)
    return target


def read_wheel(path: Path) -> dict[str, Any]:
    """The manifest inside an AOT wheel, checked against the files beside it.

    Raises ``BuildError`` when a module's bytes do not match its recorded sha256 or the
    version disagrees with the wheel's metadata.
    """
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        manifest: dict[str, Any] = json.loads(zf.read(f"{PACKAGE}/{MANIFEST}"))
        for module, entry in manifest["modules"].items():
            member = f"{PACKAGE}/{entry['path']}"
            if member not in names:
                raise BuildError(f"module {module} missing from the wheel", where=str(path))
            if hashlib.sha256(zf.read(member)).hexdigest() != entry["sha256"]:
                raise BuildError(f"module {module} does not match its sha256",
                                 where=f"{path}:{member}")
            marker = f"{PACKAGE}/{entry['marker']}"
            if marker not in names or zf.read(marker).decode().strip() != entry[
                    "sources_digest"]:
                raise BuildError(f"module {module}'s sources marker is missing or differs "
                                 "from the manifest", where=f"{path}:{marker}")
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        text = zf.read(metadata).decode()
    version = re.search(r"^Version: (.+)$", text, re.M)
    if not version or version.group(1) != manifest["version"]:
        raise BuildError("METADATA and manifest.json disagree on the version", where=str(path))
    return manifest
