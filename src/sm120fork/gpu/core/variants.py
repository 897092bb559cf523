"""The FlashInfer builds under test, each installed with its own import path and JIT
cache (patched and unpatched never share compiled modules)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sm120fork.errors import CommandError, ConfigError
from sm120fork.gpu.core.documents import Environment, VariantInfo
from sm120fork.gpu.core.safety import rank_environment
from sm120fork.util import proc, wire
from sm120fork.util.files import made_once, sha256_file, wheel_record_sha256

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

    def aot_dir(self) -> Path | None:
        return self.site / "flashinfer" / "data" / "aot" if self.site else None

    def without_prebuilt(self) -> Variant:
        aot = self.aot_dir()
        for module in self.aot_modules:
            if aot is not None and (aot / module).exists():
                shutil.rmtree(aot / module)
        return dataclasses.replace(self, aot_modules=())


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
    variant = Variant(name=name, wheel=wheel, sha256=digest, site=site, jit_base=jit,
                      record_sha256=wheel_record_sha256(wheel))
    aot = variant.aot_dir()
    assert aot is not None
    modules = copy_modules(prebuilt, aot) if prebuilt is not None else []
    if prebuilt is not None and not modules:
        raise ConfigError("no <module>/<module>.so files", where=str(prebuilt),
                          fix="point --prebuilt at a FlashInfer cached_ops directory")
    return dataclasses.replace(variant, aot_modules=tuple(modules))


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
        [proc.Child(argv=[sys.executable, "-m", "sm120fork.gpu.core.worker", str(spec)],
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

