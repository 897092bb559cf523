"""The one definition of "already upstream": a patch's fingerprint or effect at a revision.

``Fingerprint`` lines are our own text; ``Effect`` / ``Effect-Absent`` lines recognise a fix
that upstream wrote in its own words (patches/README.md).
"""

from __future__ import annotations

import fnmatch
import re

from packaging.version import InvalidVersion, Version

from sm120fork.fetch.source import UPSTREAM_TAG
from sm120fork.patch.series import (
    Fingerprint,
    Patch,
)
from sm120fork.util.proc import Git
from sm120fork.verify.artifact import upstream_text


def effect_check(repo: Git, patch: Patch, rev: str = UPSTREAM_TAG) -> tuple[bool, list[str]]:
    """Is the patch's effect present at ``rev``?  Returns (verdict, evidence lines).

    ``Effect`` lines must all be found and ``Effect-Absent`` lines all missing; without
    either, every ``Fingerprint`` must be found literally.
    """
    texts: dict[str, str] = {}

    def text(path: str) -> str:
        if path not in texts:
            texts[path] = upstream_text(repo, path, rev)
        return texts[path]

    def found(eff: Fingerprint) -> bool:
        if "*" not in eff.path:
            return eff.found_in(text(eff.path))
        prefix = eff.path.split("*", 1)[0].rpartition("/")[0]
        names = repo("ls-tree", "-r", "--name-only", rev, "--", *([prefix] if prefix else []),
                     quiet=True).splitlines()
        return any(eff.found_in(text(n)) for n in names if fnmatch.fnmatchcase(n, eff.path))

    evidence: list[str] = []
    ok = True
    if patch.effects or patch.effects_absent:
        for eff in patch.effects:
            hit = found(eff)
            ok &= hit
            evidence.append(f"Effect {eff}: {'present' if hit else 'ABSENT'}")
        for eff in patch.effects_absent:
            hit = found(eff)
            ok &= not hit
            evidence.append(f"Effect-Absent {eff}: {'PRESENT' if hit else 'absent'}")
    else:
        for fp in patch.fingerprints:
            hit = fp.text in text(fp.path)
            ok &= hit
            evidence.append(f"Fingerprint {fp}: {'present' if hit else 'absent'}")
    return ok, evidence


def fingerprints_upstream(repo: Git, patch: Patch, rev: str = UPSTREAM_TAG) -> int:
    """How many of the patch's fingerprints are already in upstream at ``rev``."""
    return sum(fp.text in upstream_text(repo, fp.path, rev) for fp in patch.fingerprints)


def applied_upstream_version(patch: Patch) -> Version | None:
    """The release named first in ``Applied-Upstream`` (``0.6.17, <url>``), if any."""
    token = re.split(r"[,\s]+", patch.applied_upstream.strip(), maxsplit=1)[0]
    try:
        return Version(token.removeprefix("v")) if token else None
    except InvalidVersion:
        return None

