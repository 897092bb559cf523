"""PEP 517 backend of the AOT wheel: runs the toolkit's ``build-aot`` into the wheel dir.

The wheel is not assembled from files in this folder: ``sm120fork.aot`` compiles the
stack's FlashInfer tree and writes the wheel, so this backend only says where.  The
toolkit must be installed in the build environment (cibuildwheel's before-build does it;
``nox -s build_aot`` does it in its session), hence no build isolation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]


def _stack(config_settings: dict[str, Any] | None) -> str | None:
    value = (config_settings or {}).get("stack") or os.environ.get("SM120FORK_STACK")
    return str(value) if value else None


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    from sm120fork.aot.wheel import PACKAGE
    from sm120fork.cli.main import main

    argv = ["--root", str(_ROOT), "build-aot", "--out", wheel_directory]
    stack = _stack(config_settings)
    if stack:
        argv += ["--stack", stack]
    for key in ("capabilities", "jobs"):
        if (config_settings or {}).get(key):
            argv += [f"--{key}", str(config_settings[key])]  # type: ignore[index]
    if main(argv) != 0:
        raise RuntimeError("sm120fork build-aot failed (its error is printed above)")
    wheels = sorted(Path(wheel_directory).glob(f"{PACKAGE}-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one AOT wheel in {wheel_directory}, found {len(wheels)}")
    return wheels[0].name
