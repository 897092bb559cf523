"""A GPU run's evidence record (kind ``gpu-test``): ``record.json`` beside the harness's
output, imported by ``nox -s record_import``.  What was tested comes from ``tested.json``
beside the build's wheels; cases that never ran leave the record unfinished.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from sm120fork import record
from sm120fork.gpu.core.documents import Environment
from sm120fork.gpu.core.safety import COMMAND_ENV
from sm120fork.util import hint

TESTED_FILE = "tested.json"


#: Options whose values are this machine's paths: not part of the recorded command.
PATH_OPTIONS = ("--out", "--work-dir", "--wheel-dir", "--prebuilt", "--tests", "--stack-dir",
                "--plugin-wheel", "--stock-wheel")


#: A path into a folder only the box had (a record names none: ``record.MACHINE_PATH``).
_BOX_PATH = re.compile(r"(?<![\w<>.-])(?:/(?:opt|root|work|home|tmp|scratch|mnt|data|var|usr|"
                       r"Users)/|[A-Za-z]:\\)[^\s;,)'\"]*")


def no_box_paths(text: str) -> str:
    return _BOX_PATH.sub("<path>", text)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


def policy_made(*, gpu: str, gpu_count: int, shared: bool, stack: str | None,
                flashinfer: str | None, wheel_sha256: str | None, hidden: Iterable[int],
                note: str | None) -> dict[str, str | int | bool | list[int] | None]:
    """The policy's ``made`` block: the bench's box and build (``gpu.policy.derive``)."""
    return {"created": now(), "gpu": gpu, "gpu_count": gpu_count, "shared_gpu": shared,
            "stack": stack, "flashinfer": flashinfer, "wheel_sha256": wheel_sha256,
            "dtype": "bf16", "hidden": sorted(set(hidden)), "note": note}


def recorded_command(verb: str, argv: Sequence[str]) -> str:
    """The command that re-makes the run, as its user typed it, less this machine's paths."""
    shown = os.environ.get(COMMAND_ENV)
    if shown:
        return shown
    args: list[str] = []
    skip = False
    for arg in argv[1:]:
        if not skip and arg not in PATH_OPTIONS and not arg.startswith(
                tuple(o + "=" for o in PATH_OPTIONS)):
            args.append(arg)
        skip = not skip and arg in PATH_OPTIONS
    return hint.command(f"gpu {verb}", *args) if hint.via_nox() else shlex.join(
        ["python", "-m", "sm120fork", "gpu", verb, *args])


def machine_of(env: Environment, shared: bool | None) -> record.Machine:
    gpus = tuple(str(g) for g in env.get("gpus") or ())
    cap = env.get("capability")
    return record.Machine(
        description=f"{gpus[0]} x{env.get('gpu_count', len(gpus))}" if gpus else "no GPU",
        gpus=gpus, capability=".".join(map(str, cap)) if cap else None,
        driver=env.get("driver"), cuda=env.get("torch_cuda"), torch=env.get("torch"),
        python=env.get("python"), cpus=os.cpu_count(), shared_gpu=shared)


def tested_block(wheels: Sequence[record.TestedWheel], tested: record.Tested | None
            ) -> record.Tested:
    """What a run tested: its wheels, and the trees and patches of the projects whose
    build it ran (a change to another project's series does not stale the record)."""
    tested = tested or record.Tested()
    ran = {w.project for w in wheels if w.variant not in record.BASELINE_VARIANTS}
    return record.Tested(
        wheels=tuple(wheels),
        trees=tuple(t for t in tested.trees if t.project in ran),
        patches=tuple(p for p in tested.patches if p.project in ran))


def beside(where: Path | None, name: str) -> Path | None:
    """The file ``name`` in the folder ``where``, or beside the wheel ``where``, if there."""
    path = None if where is None else (where if where.is_dir() else where.parent) / name
    return path if path is not None and path.is_file() else None


def tested_beside(where: Path | None) -> record.Tested | None:
    """``tested.json`` beside a stack's wheel or in its folder (a kit's stack/), if there."""
    return None if (path := beside(where, TESTED_FILE)) is None else record.read_tested(path)


def write(rec: record.Record, out: Path) -> Path:
    """``record.json`` and ``summary.md`` of ``rec`` in ``out`` (the run's own folder)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / record.RECORD_FILE
    path.write_text(record.dumps(rec), encoding="utf-8")
    (out / record.SUMMARY_FILE).write_text(record.summary(rec), encoding="utf-8")
    return path
