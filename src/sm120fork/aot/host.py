"""cibuildwheel's build of ``aot/``, run on this host (no container engine here).

The steps are read from ``aot/pyproject.toml`` through cibuildwheel's own options reader and
run in the order its Linux platform runs them; the test environment sees the build
environment's packages (``--system-site-packages``, so torch is not installed twice).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform as platform_mod
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from packaging.utils import canonicalize_name

from sm120fork.aot import wheel as wheel_mod
from sm120fork.aot.compile import DEFAULT_CAPABILITIES
from sm120fork.errors import BuildError, CommandError, ConfigError
from sm120fork.package.wheel import wheel_requirements
from sm120fork.util import proc

log = logging.getLogger("sm120fork")


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
    options = compute_options("linux", args, env=dict(env or {}))
    build = options.build_options(identifier)
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


def run(project: Path, package_dir: Path, out: Path) -> Path:
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
