"""``build-aot``: the stack's FlashInfer sources -> compiled module -> checked -> AOT wheel.

The sources are the fork tree the stack's published FlashInfer wheel was built from (same
git tree hash), or that wheel itself where the stack ships FlashInfer as published.
"""

from __future__ import annotations

import dataclasses
import logging
import sysconfig
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from sm120fork import __version__
from sm120fork import manifest as manifest_file
from sm120fork.aot import check
from sm120fork.aot import compile as compile_mod
from sm120fork.aot import wheel as wheel_mod
from sm120fork.aot.compile import DEFAULT_CAPABILITIES
from sm120fork.declare import Stack
from sm120fork.errors import BuildError, ConfigError
from sm120fork.util.files import made_once, sha256_file
from sm120fork.util.git import Git
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

FLASHINFER_KEY = "flashinfer"
#: This machine's wheel platform tag (``linux_x86_64``); auditwheel makes it manylinux.
_PLATFORM = sysconfig.get_platform().replace("-", "_").replace(".", "_")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AotBuild:
    wheel: Path
    compiled: compile_mod.Compiled
    manifest: wheel_mod.AotManifest
    code: tuple[check.TargetCode, ...]
    checks: tuple[check.TargetCheck, ...]


def default_out(ws: Workspace, stack: Stack) -> Path:
    """``wheels/aot/<stack>/``: beside, not inside, the folder the stack's build replaces."""
    return ws.wheels_dir / "aot" / stack.name


def flashinfer_build(wheels_dir: Path, stack: Stack) -> wheel_mod.FlashInferBuild:
    """The FlashInfer wheel this stack published (its entry in manifest.json)."""
    path = wheels_dir / manifest_file.FILE
    manifest = manifest_file.read(path, fix=f"run `{command('build', '--stack', stack.name)}` "
                                            "first")
    if manifest.stack != stack.name:
        raise ConfigError(f"manifest.json is for stack {manifest.stack!r}, not "
                          f"{stack.name!r}", where=str(path),
                          fix=f"run `{command('build', '--stack', stack.name)}`")
    entry = manifest.first(FLASHINFER_KEY)
    if entry is None:
        raise ConfigError("manifest.json has no flashinfer wheel", where=str(path))
    return wheel_mod.FlashInferBuild.from_manifest(entry, where=str(path))


def tree_hash(tree: Path) -> str:
    """The git tree hash of the fork tree's HEAD (refusing uncommitted changes)."""
    repo = Git(tree)
    if repo("status", "--porcelain", "--untracked-files=no"):
        raise ConfigError("the fork tree has uncommitted changes", where=str(tree),
                          fix="commit them (and refresh the series) or rebuild the stack")
    return repo.tree_hash()


def sources(ws: Workspace, stack: Stack, wheels_dir: Path,
            flashinfer: wheel_mod.FlashInferBuild) -> Path:
    """The fork tree the stack's FlashInfer wheel was built from, or that wheel, published
    (unpacked once, by its sha256)."""
    if flashinfer.tree is None:
        wheel = wheels_dir / flashinfer.wheel
        if not wheel.is_file() or sha256_file(wheel) != flashinfer.sha256:
            raise ConfigError(f"{flashinfer.wheel} is missing or not the wheel manifest.json "
                              f"pins (sha256 {flashinfer.sha256[:12]})", where=str(wheel),
                              fix=f"rebuild the stack: {command('build')}")

        def unpack(new: Path) -> None:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(new)

        return made_once(ws.state_dir / "aot" / "sources" / flashinfer.sha256[:24],
                         flashinfer.sha256, unpack)
    tree = ws.work_tree(stack, stack.project(FLASHINFER_KEY))
    if not tree.is_dir():
        raise ConfigError("no FlashInfer fork tree", where=str(tree),
                          fix=f"run `{command('build', '--stack', stack.name)}` first")
    found = tree_hash(tree)
    if found != flashinfer.tree:
        raise BuildError(f"the fork tree ({found[:12]}) is not the tree "
                         f"{flashinfer.wheel} was built from ({flashinfer.tree[:12]})",
                         where=str(tree), fix=f"run `{command('build', '--stack', stack.name)}`")
    return tree


def build_aot(ws: Workspace, stack: Stack, *, capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
              wheels_dir: Path | None = None, out: Path | None = None, jobs: int = 2,
              rebuild: bool = False, platform: str | None = None) -> AotBuild:
    """Compile the stack's trtllm comm module and write the AOT wheel (into ``out``)."""
    wheels_dir = wheels_dir or ws.stack_wheels(stack.name)
    flashinfer = flashinfer_build(wheels_dir, stack)
    tree = sources(ws, stack, wheels_dir, flashinfer)
    lookup = wheel_mod.of_tree(tree, stack.name)
    cache = ws.state_dir / "aot" / stack.name
    toolchain = compile_mod.prepare(cache / "link")
    compiled = compile_mod.build(tree, capabilities, toolchain, cache / "modules",
                                 jobs=jobs, rebuild=rebuild)
    if compiled.plan.flashinfer_version.split("+")[0] != flashinfer.upstream_version:
        raise BuildError(f"the tree says FlashInfer {compiled.plan.flashinfer_version}, the "
                         f"manifest {flashinfer.upstream_version}", where=str(tree))
    code = tuple(check.embedded_code(compiled.so))
    checks = tuple(check.check_module(code))
    bad = [c for c in checks if not c.ok]
    if bad:
        raise BuildError("kernels missing or empty: " + "; ".join(
            f"{c.target}: {len(c.missing)} missing, {len(c.empty)} empty" for c in bad),
            where=str(compiled.so), fix="the tree's SM12x fixes are not in effect")
    digest, digest_by = wheel_mod.tree_digest(tree)
    module = wheel_mod.Module(name=compile_mod.MODULE, so=compiled.so,
                              targets=compiled.plan.targets, sources_digest=digest,
                              info={"arch_list": compiled.plan.arch_list,
                                    "sources_digest_by": digest_by,
                                    "cache_key": compiled.key,
                                    "tvm_ffi_version": compiled.plan.tvm_ffi_version,
                                    "code": check.summary(code, checks)})
    with tempfile.TemporaryDirectory(prefix="sm120fork-aot-", dir=ws.state_dir) as tmp:
        built = wheel_mod.write_wheel(
            Path(tmp), flashinfer=flashinfer, modules=[module],
            cuda_version=toolchain.version, platform=platform or _PLATFORM, stack=stack.name,
            toolkit_version=__version__, lookup=lookup,
            toolchain={"nvcc": toolchain.version_text, "cuda": toolchain.version,
                       "source": toolchain.source,
                       "compile": compiled.to_dict()})
        final = wheel_mod.publish(built, out or default_out(ws, stack))
    manifest = wheel_mod.read_wheel(final)
    log.info("wrote %s", final)
    return AotBuild(wheel=final, compiled=compiled, manifest=manifest, code=code, checks=checks)
