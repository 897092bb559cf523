"""pypa/build run as the toolkit's one way to make a wheel of a project folder: the
patched projects' wheels (``package/wheel.py``), the SGLang plugin's (``plugin/build.py``)
and the GPU A/B's upstream baseline (``gpu/core/stack_wheels.py``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from sm120fork.errors import BuildError, CommandError
from sm120fork.util.proc import run


def pypa_build(project_dir: Path, dist: Path, *, name: str, where: str,
               env: dict[str, str], on_line: Callable[[str], None] | None = None) -> Path:
    """The one wheel pypa/build makes of ``project_dir`` in ``dist``."""
    try:
        run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(project_dir)],
            env=env, on_line=on_line)
    except CommandError as exc:
        raise BuildError(f"building the {name} wheel failed", where=where, detail=exc.detail,
                         fix="read the build output above") from exc
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one {name} wheel, got {[w.name for w in wheels]}",
                         where=where)
    return wheels[0]
