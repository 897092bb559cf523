"""Publish a stack's checked wheels, ``constraints.txt`` and ``manifest.json``.

``wheels/`` is updated only after every project built and passed, file by file with
atomic renames, manifest last.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120fork import __version__
from sm120fork.declare import Stack
from sm120fork.util.files import atomic_copy, atomic_write_text, read_json_object, sha256_file
from sm120fork.workspace import Workspace

MANIFEST = "manifest.json"
CONSTRAINTS = "constraints.txt"


@dataclass(frozen=True, kw_only=True)
class ProjectBuild:
    project: str
    distribution: str
    upstream_version: str
    version: str
    wheel: Path
    sha256: str
    cached: bool
    seconds: float
    entry: dict[str, Any]


def publish(ws: Workspace, stack: Stack, builds: list[ProjectBuild],
            out: Path | None = None) -> Path:
    """Place wheels, constraints.txt and manifest.json into wheels/ (or ``out``) atomically."""
    out = out or ws.wheels_dir
    out.mkdir(parents=True, exist_ok=True)
    for b in builds:
        dest = out / b.wheel.name
        if dest.is_file() and sha256_file(dest) == b.sha256:
            continue
        atomic_copy(b.wheel, dest)
    constraints = "".join(f"{b.distribution}=={b.version}\n" for b in builds)
    atomic_write_text(out / CONSTRAINTS,
                      f"# {stack.name}: pip install -c wheels/{CONSTRAINTS} wheels/*.whl\n"
                      + constraints)
    manifest = {
        "toolkit_version": __version__,
        "stack": stack.name,
        "wheels": [b.entry for b in builds],
    }
    new_text = json.dumps(manifest, indent=2) + "\n"
    old = out / MANIFEST
    if not old.is_file() or old.read_text() != new_text:
        atomic_write_text(old, new_text)
    keep = {b.wheel.name for b in builds}
    for stale in out.glob("*.whl"):
        if stale.name not in keep:
            stale.unlink()
    return out


def load_manifest(ws: Workspace) -> dict[str, Any] | None:
    return read_json_object(ws.wheels_dir / MANIFEST)
