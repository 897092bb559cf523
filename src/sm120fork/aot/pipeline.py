"""``build-aot``: the stack's FlashInfer sources -> compiled module -> checked -> AOT wheel.

The sources are the fork tree the stack's published FlashInfer wheel was built from (same
git tree hash), or that wheel itself where the stack ships FlashInfer as published.  With
``--via-cibuildwheel`` the steps are read from ``aot/pyproject.toml`` through cibuildwheel's
own options reader and run on this host (no container engine) in the order its Linux
platform runs them; the test environment sees the build environment's packages.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform as platform_mod
import re
import shutil
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from sm120fork import __version__
from sm120fork import manifest as manifest_file
from sm120fork.aot import check
from sm120fork.aot import compile as compile_mod
from sm120fork.aot import wheel as wheel_mod
from sm120fork.aot.compile import DEFAULT_CAPABILITIES
from sm120fork.declare import Stack
from sm120fork.errors import BuildError, CommandError, ConfigError
from sm120fork.package.wheel import wheel_requirements
from sm120fork.util import proc
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
    rebuild = f"run `{command('build', '--stack', stack.name)}`"
    manifest = manifest_file.read(path, fix=f"{rebuild} first")
    if manifest.stack != stack.name:
        raise ConfigError(f"manifest.json is for stack {manifest.stack!r}, not "
                          f"{stack.name!r}", where=str(path), fix=rebuild)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostPlan:
    """What cibuildwheel would run for ``identifier``, placeholders still in place."""

    identifier: str
    before_build: str
    frontend: str
    frontend_args: tuple[str, ...]
    repair: str
    before_test: str
    test_command: str
    environment: Mapping[str, str]


def resolve(package_dir: Path, identifier: str,
            env: Mapping[str, str] | None = None) -> HostPlan:
    """The build options cibuildwheel's options reader gives ``identifier``."""
    from cibuildwheel.options import CommandLineArguments, compute_options

    args = CommandLineArguments.defaults()
    args.platform = "linux"
    args.package_dir = package_dir
    build = compute_options("linux", args, env=dict(env or {})).build_options(identifier)
    environment = build.environment.as_dictionary(prev_environment={})
    return HostPlan(identifier=identifier, before_build=build.before_build or "",
                    frontend=build.build_frontend.name,
                    frontend_args=tuple(build.build_frontend.args),
                    repair=build.repair_command, before_test=build.before_test or "",
                    test_command=build.test_command or "", environment=environment)


def _sh(command: str, env: Mapping[str, str], cwd: Path, **values: str | Path) -> None:
    """A step's command, cibuildwheel's placeholders filled in, run by ``sh``."""
    from cibuildwheel.util.helpers import prepare_command

    if command.strip():
        proc.run(["sh", "-c", prepare_command(command, **values)], env=env, cwd=cwd)


def build_via_cibuildwheel(project: Path, package_dir: Path, out: Path) -> Path:
    """Build, repair and test the AOT wheel as cibuildwheel would; returns the wheel in out."""
    listed = proc.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers",
                       "--platform", "linux", "--archs", platform_mod.machine(), package_dir],
                      quiet=True).stdout.split()
    if not listed:
        raise ConfigError("cibuildwheel selects no build for this machine",
                          where=str(package_dir / "pyproject.toml"))
    identifier = listed[0]
    plan = resolve(package_dir, identifier, os.environ)
    if plan.frontend != "build":
        raise ConfigError(f"build frontend {plan.frontend!r}: only 'build' runs on the host",
                          where=str(package_dir / "pyproject.toml"))
    env = {**os.environ, **plan.environment}
    places: dict[str, str | Path] = {"project": project, "package": package_dir}
    log.info("cibuildwheel %s, on this host", identifier)
    _sh(plan.before_build, env, project, **places)
    with tempfile.TemporaryDirectory(prefix="sm120fork-cibw-") as tmp:
        built_dir, repaired_dir = Path(tmp) / "built", Path(tmp) / "repaired"
        capabilities = next((a.split("capabilities=", 1)[1] for a in plan.frontend_args
                             if "capabilities=" in a), ",".join(DEFAULT_CAPABILITIES))
        log.info("building the AOT wheel: FlashInfer's trtllm comm module for compute "
                 "capabilities %s (nvcc, minutes per target; about 40 min on 2 cores); "
                 "progress follows", capabilities)
        proc.run([sys.executable, "-m", "build", "--wheel", *plan.frontend_args,
                  "--outdir", built_dir, package_dir], env=env, cwd=project,
                 on_line=_forward_progress)
        wheel = _one_wheel(built_dir)
        if plan.repair.strip():
            repaired_dir.mkdir()
            _sh(plan.repair, env, project, wheel=wheel, dest_dir=repaired_dir, **places)
            wheel = _one_wheel(repaired_dir)
        if plan.test_command.strip():
            run_test_step(plan, wheel, out, env, places, Path(tmp))
        return wheel_mod.publish(wheel, out)


def install_index_args(wheel: Path) -> list[str]:
    """pip options that reach what the wheel requires beyond the default index (upstream's
    jit-cache shim is on FlashInfer's own index only: ``Lookup.through_index``)."""
    requires = wheel_requirements(wheel)
    args: list[str] = []
    for lookup in wheel_mod.LOOKUPS:
        if lookup.through is None or lookup.through_index is None:
            continue
        for req in requires:
            if canonicalize_name(req.name) != canonicalize_name(lookup.through):
                continue
            cuda = re.search(r"\+cu(\d+)", str(req.specifier))
            if cuda:
                args += ["--extra-index-url", lookup.through_index.format(cuda=cuda.group(1))]
    return args


def run_test_step(plan: HostPlan, wheel: Path, out: Path, env: Mapping[str, str],
                  places: Mapping[str, str | Path], tmp: Path) -> None:
    """cibuildwheel's test step in a fresh virtual environment; a failing step keeps the
    wheel (hours of nvcc) under ``<out>/untested/`` and names the step."""
    venv = tmp / "venv"
    proc.run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    test_env = {**env, "VIRTUAL_ENV": str(venv),
                "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    index = install_index_args(wheel)
    step = "before-test"
    try:
        _sh(plan.before_test, test_env, Path(places["project"]), **places)
        step = "installing the wheel" + (f" (with {' '.join(index)})" if index else "")
        proc.run([venv / "bin" / "python", "-m", "pip", "install", "-q", *index, wheel],
                 env=test_env)
        step = "test-command"
        cwd = tmp / "test_cwd"
        cwd.mkdir(exist_ok=True)
        _sh(plan.test_command, test_env, cwd, wheel=wheel, **places)
    except (CommandError, BuildError) as exc:
        kept = out / "untested" / wheel.name
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, kept)
        needs = (f"; it requires what only {index[-1]} serves: reach that index, or put "
                 "those wheels in a folder and set PIP_FIND_LINKS to it" if index else "")
        raise BuildError(
            f"the AOT wheel was built but its test step failed at {step}: {exc.what}",
            where=str(kept),
            fix=f"the wheel is kept there, untested{needs}; check it with `python -m "
                f"sm120fork aot-check <that wheel>` once it installs") from exc


def _forward_progress(line: str) -> None:
    """Show the AOT backend's progress lines (what it compiles, each ninja step) live;
    everything else stays captured, shown only on failure."""
    text = line.strip()
    if "AOT build step " in text or ("trtllm_comm" in text and (
            "compiling" in text or "built in" in text or "cached" in text)):
        log.info("%s", text.split(None, 1)[1] if text.startswith("INFO") else text)


def _one_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one wheel, found {len(wheels)}", where=str(folder))
    return wheels[0]
