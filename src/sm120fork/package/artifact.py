"""The artifact check: every patch's effect must reach the wheel we ship.

Each ``Fingerprint`` text is present in the shipped wheel's file and absent from unpatched
upstream (:mod:`sm120fork.patch.upstream_match`); a patch that never reaches the wheel
fails the build.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from sm120fork.declare import Project
from sm120fork.errors import ArtifactCheckError
from sm120fork.fetch.source import UPSTREAM_TAG
from sm120fork.manifest import FingerprintResult
from sm120fork.patch.series import Series
from sm120fork.patch.upstream_match import fingerprint_in, fingerprints_at
from sm120fork.util.git import Git


def wheel_members(zf: zipfile.ZipFile, project: Project, path: str) -> list[str]:
    """Wheel members that ship the upstream file ``path``."""
    rel = project.package_path(path)
    if rel is None:
        return []
    names = zf.namelist()
    if rel in names:
        return [rel]
    return [n for n in names if n.endswith("/" + rel)]


def check_wheel(wheel: Path, project: Project, series: Series, repo: Git,
                base: str = UPSTREAM_TAG) -> list[FingerprintResult]:
    results: list[FingerprintResult] = []
    with zipfile.ZipFile(wheel) as zf:
        for patch in series.patches:
            for fp, in_upstream in fingerprints_at(repo, patch, base):
                members = wheel_members(zf, project, fp.path)
                in_wheel = bool(members) and all(fingerprint_in(
                    fp, zf.read(m).decode("utf-8", errors="replace")) for m in members)
                results.append(FingerprintResult(
                    patch=patch.name, path=fp.path, text=fp.text, in_wheel=in_wheel,
                    member=", ".join(members) or "(not in wheel)", in_upstream=in_upstream))
    return results


def require_passed(results: list[FingerprintResult], project: Project) -> None:
    failed = [r for r in results if not r.passed]
    if not failed:
        return
    lines = []
    for r in failed:
        why = ("already present in unpatched upstream" if r.in_upstream
               else f"missing from the wheel ({r.member})")
        lines.append(f"{r.patch}: {r.path}: {r.text!r}: {why}")
    raise ArtifactCheckError(
        f"{len(failed)} fingerprint(s) failed: " + "; ".join(lines),
        where=f"project {project.key}",
        fix="a patch that never reaches the wheel, or whose fingerprint upstream already has, "
            "needs a better fingerprint or a fix")
