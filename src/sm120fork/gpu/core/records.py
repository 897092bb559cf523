"""A GPU run's evidence record (:mod:`sm120fork.record`, kind ``gpu-test``).

The harness writes ``record.json`` beside its own output; ``nox -s record_import -- DIR``
publishes it into ``reports/<stack>/gpu-test/``.  What was tested comes from the stack's
build: the wheels' sha256 (each variant's), and the patched trees and each patch's change
identity, as ``tested.json`` beside the build's ``manifest.json`` gives them (the kit
writes it; in a checkout ``--stack`` computes it: :mod:`sm120fork.resolved`).  A run whose
wheels are no stack's build writes no record.  Cases that never ran (a module that did not build,
a budget used up) are left out of ``cases``: the record is then unfinished, never
"0 failing".
"""

from __future__ import annotations

import datetime
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from sm120fork import record
from sm120fork.gpu.core.documents import (
    Environment,
)
from sm120fork.gpu.core.preflight import COMMAND_ENV

TESTED_FILE = "tested.json"


#: Options whose values are this machine's paths: not part of the recorded command.
PATH_OPTIONS = ("--out", "--work-dir", "--wheel-dir", "--prebuilt", "--stack-dir",
                "--plugin-wheel", "--stock-wheel")


def now() -> str:
    """When a run's report or record was made (UTC, to the second)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


def command_line(argv: Sequence[str]) -> str:
    """How a report names the command that made it."""
    return shlex.join(["python", "-m", "sm120fork.gpu", *argv])


def recorded_command(verb: str, argv: Sequence[str]) -> str:
    """The command that re-makes the run, as its user typed it, less this machine's paths."""
    shown = os.environ.get(COMMAND_ENV)
    if shown:
        return shown
    from sm120fork.util import hint

    args: list[str] = []
    skip = False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg in PATH_OPTIONS:
            skip = True
            continue
        if not any(arg.startswith(o + "=") for o in PATH_OPTIONS):
            args.append(arg)
    return hint.command(f"gpu {verb}", *args) if hint.via_nox() else shlex.join(
        ["python", "-m", "sm120fork", "gpu", verb, *args])


def machine_of(env: Environment, shared: bool) -> record.Machine:
    gpus = tuple(str(g) for g in env.get("gpus") or ())
    cap = env.get("capability")
    return record.Machine(
        description=f"{gpus[0] if gpus else 'unknown GPU'} x{env.get('gpu_count', len(gpus))}",
        gpus=gpus, capability=".".join(map(str, cap)) if cap else None,
        driver=env.get("driver"), cuda=env.get("torch_cuda"), torch=env.get("torch"),
        python=env.get("python"), cpus=os.cpu_count(), shared_gpu=shared)


def tested_block(wheels: Sequence[record.TestedWheel], tested: record.Tested | None
            ) -> record.Tested:
    """What a run tested: its wheels, and the trees and patches of the projects whose
    build it ran (an A/B of the FlashInfer wheel tested none of the SGLang series, so a
    change there does not make its record stale)."""
    tested = tested or record.Tested()
    ran = {w.project for w in wheels if w.variant not in record.BASELINE_VARIANTS}
    return record.Tested(
        wheels=tuple(wheels),
        trees=tuple(t for t in tested.trees if t.project in ran),
        patches=tuple(p for p in tested.patches if p.project in ran))


def tested_beside(folder: Path) -> record.Tested | None:
    """``tested.json`` in a stack's wheels folder (a kit's stack/), if there (refused,
    naming the file and key, when it is there but not one)."""
    path = folder / TESTED_FILE
    return record.read_tested(path) if path.is_file() else None


def read_tested(wheel_dirs: Sequence[str], primary: str) -> record.Tested | None:
    """``tested.json`` beside the primary variant's wheel (a kit's, or a build's)."""
    for spec in wheel_dirs:
        name, _, where = spec.partition("=")
        if name != primary:
            continue
        tested = tested_beside(Path(where) if Path(where).is_dir() else Path(where).parent)
        if tested is not None:
            return tested
    return None


def write(rec: record.Record, out: Path) -> Path:
    """``record.json`` and ``summary.md`` of ``rec`` in ``out`` (the run's own folder)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / record.RECORD_FILE
    path.write_text(record.dumps(rec), encoding="utf-8")
    (out / record.SUMMARY_FILE).write_text(record.summary(rec), encoding="utf-8")
    return path
