"""The FlashInfer builds under test, each installed with its own import path and JIT
cache (patched and unpatched never share compiled modules), and the groups of processes
that run on one: its module build, and one worker per rank under the one supervisor."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sm120fork.errors import CommandError, ConfigError
from sm120fork.gpu.core.documents import Environment, VariantInfo
from sm120fork.gpu.core.safety import rank_environment
from sm120fork.util import proc, wire
from sm120fork.util.files import made_once, sha256_file, wheel_record_sha256
from sm120fork.util.proc import Child, GroupOutcome

log = logging.getLogger("sm120fork")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    wheel: Path | None
    sha256: str | None
    site: Path | None
    jit_base: Path
    aot_modules: tuple[str, ...] = ()
    #: sha256 of the wheel's RECORD: the same files when a wheel was zipped again.
    record_sha256: str | None = None

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        paths = [str(self.site)] if self.site else []
        paths.append(str(source_root()))
        if base.get("PYTHONPATH"):
            paths.append(base["PYTHONPATH"])
        return rank_environment(base, {
            "PYTHONPATH": os.pathsep.join(paths),
            "FLASHINFER_WORKSPACE_BASE": str(self.jit_base),
        })

    def describe(self) -> VariantInfo:
        return VariantInfo(wheel=self.wheel.name if self.wheel else None, sha256=self.sha256,
                           record_sha256=self.record_sha256,
                           site=str(self.site) if self.site else None,
                           prebuilt_modules=list(self.aot_modules))

    def without_prebuilt(self) -> Variant:
        if self.site is not None:
            for module in self.aot_modules:
                shutil.rmtree(aot_dir(self.site) / module, ignore_errors=True)
        return dataclasses.replace(self, aot_modules=())


def aot_dir(site: Path) -> Path:
    """Where the FlashInfer installed in ``site`` looks for prebuilt (AOT) modules."""
    return site / "flashinfer" / "data" / "aot"


def source_root() -> Path:
    """The folder holding ``sm120fork`` (the ranks' PYTHONPATH): never the package itself,
    whose ``cuda`` would hide cuda-bindings' namespace."""
    return Path(__file__).resolve().parents[3]


def find_flashinfer_wheel(path: Path) -> Path:
    if path.is_file():
        return path
    wheels = sorted(path.glob("flashinfer_python-*.whl"))
    if len(wheels) != 1:
        raise ConfigError(
            f"expected exactly one flashinfer_python-*.whl, found {len(wheels)}",
            where=str(path), fix="point --wheel-dir at a directory with one FlashInfer wheel")
    return wheels[0]


def install_variant(name: str, source: Path | None, work_dir: Path,
                    prebuilt: Path | None = None) -> Variant:
    """Install the variant's wheel into its own folder (no index, no deps), with the
    ``prebuilt`` ``<module>/<module>.so`` where FlashInfer looks for AOT modules."""
    base = work_dir / name
    jit = base / "jit"
    jit.mkdir(parents=True, exist_ok=True)
    if source is None:
        return Variant(name=name, wheel=None, sha256=None, site=None, jit_base=jit)
    wheel = find_flashinfer_wheel(source)
    digest = sha256_file(wheel)

    def install(site: Path) -> None:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
               "--no-compile", "--target", str(site), str(wheel)]
        done = proc.run(cmd, check=False)
        if done.returncode != 0:
            raise CommandError(f"installing {wheel.name} for variant {name} failed",
                               detail=(done.stdout + done.stderr)[-4000:])

    site = made_once(base / "site", digest, install)
    modules = copy_modules(prebuilt, aot_dir(site)) if prebuilt is not None else []
    if prebuilt is not None and not modules:
        raise ConfigError("no <module>/<module>.so files", where=str(prebuilt),
                          fix="point --prebuilt at a FlashInfer cached_ops directory")
    return Variant(name=name, wheel=wheel, sha256=digest, site=site, jit_base=jit,
                   record_sha256=wheel_record_sha256(wheel), aot_modules=tuple(modules))


def copy_modules(source: Path, dest: Path) -> list[str]:
    """The modules ``source/<module>/<module>.so`` copied to ``dest/<module>/``, each with
    the sources digest a patched FlashInfer checks before it loads it."""
    modules = []
    for so in sorted(source.glob("*/*.so")):
        if so.stem != so.parent.name:
            continue
        (dest / so.stem).mkdir(parents=True, exist_ok=True)
        for f in (so, so.with_name(so.name + ".sources")):
            if f.is_file():
                shutil.copy2(f, dest / so.stem / f.name)
        modules.append(so.stem)
    return modules


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModuleBuild:
    ok: bool
    #: the probe's environment (the box and the FlashInfer of the variant)
    env: Environment
    failure: str | None = None
    tail: tuple[str, ...] = ()
    #: {module: reason} of the optional modules that did not build
    module_failures: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: why its prebuilt modules did not load (this build then JIT-compiled them)
    prebuilt_failure: str | None = None


def compile_variants(variants: Sequence[Variant], run_dir: Path, *, modules: Sequence[str],
                     timeout: float) -> dict[str, ModuleBuild]:
    """JIT-build each variant's modules once, all variants in parallel."""
    spec = run_dir / "compile-spec.json"
    spec.write_text(json.dumps({"mode": "compile", "modules": list(modules)}))
    envs: dict[int, Environment] = {}
    module_failures: dict[int, dict[str, str]] = {}

    def on_message(idx: int, message: wire.Message) -> None:
        if message.tag == "ENV":
            envs[idx] = message.data
        elif message.tag == "MODULE" and not message.data.get("ok"):
            module_failures.setdefault(idx, {})[message.data["module"]] = message.data["reason"]

    outcome = proc.run_group(
        [Child(argv=[sys.executable, "-m", "sm120fork.gpu.core.worker", str(spec)],
                         env=v.env(os.environ), log=run_dir / f"compile-{v.name}.log",
                         name=f"variant {v.name}") for v in variants],
        timeouts=proc.Timeouts(startup=timeout, idle=timeout), on_message=on_message,
        fail_fast=False)
    result = {}
    for idx, v in enumerate(variants):
        rc = outcome.returncodes[idx]
        ok = rc == 0
        last = next((line for line in reversed(outcome.tails[idx]) if line.strip()), "")
        failure = None if ok else (f"exit code {rc}: {last}" if rc is not None
                                   else outcome.failure)
        result[v.name] = ModuleBuild(ok=ok, env=envs.get(idx, {}), failure=failure,
                                     tail=tuple(outcome.tails[idx]),
                                     module_failures=module_failures.get(idx, {}))
    return result


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timeouts(proc.Timeouts):
    """The supervisor's bounds with the launcher's defaults, and its circuit breaker."""

    startup: float | None = 300.0
    idle: float | None = 90.0
    #: hangs (crashes) in a row of one API after which its other cases are not attempted
    max_hang_streak: int = 4
    max_crash_streak: int = 12


def run_ranks(worker: Sequence[str], spec: Callable[[Path], object], world: int,
              variant: Variant, log_stem: Path, timeouts: Timeouts,
              on_message: Callable[[int, wire.Message], None],
              extra_env: Mapping[str, str] | None = None,
              settled: Callable[[list[int | None]], bool] | None = None) -> GroupOutcome:
    """One worker process per rank on the spec file ``spec(store)`` (JSON, a dataclass as its
    fields) beside ``log_stem`` (``spec-<name>.json``, a fresh ``store-<name>``), logging to
    ``<log_stem>-rank<r>.log``."""
    store = log_stem.with_name(f"store-{log_stem.name}")
    store.unlink(missing_ok=True)
    spec_path = log_stem.with_name(f"spec-{log_stem.name}.json")
    spec_path.write_text(json.dumps(spec(store), default=dataclasses.asdict))
    env = {**variant.env(os.environ), **(extra_env or {})}
    return proc.run_group(
        [Child(argv=[*worker, str(spec_path), str(r)], env=env, name=f"rank {r}",
               log=log_stem.with_name(f"{log_stem.name}-rank{r}.log")) for r in range(world)],
        timeouts=timeouts, on_message=on_message, settled=settled)
