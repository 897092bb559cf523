"""The one definition of "already upstream": ``Fingerprint`` lines (our text) matched
literally, ``Effect`` / ``Effect-Absent`` lines (a fix in upstream's own words)."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from sm120fork.errors import CommandError
from sm120fork.fetch.source import UPSTREAM_TAG
from sm120fork.patch.series import Fingerprint, Patch
from sm120fork.util.git import Git


def text_at(repo: Git, path: str, rev: str = UPSTREAM_TAG) -> str:
    try:
        return repo.show(rev, path) or ""
    except CommandError:  # no such revision
        return ""


def fingerprint_in(fp: Fingerprint, text: str) -> bool:
    return fp.text in text


@dataclass(frozen=True, kw_only=True)
class UpstreamMatch:
    fingerprints: tuple[bool, ...]
    #: None when the patch has no Effect lines.
    effect: bool | None
    evidence: tuple[str, ...]

    @property
    def fingerprints_present(self) -> int:
        return sum(self.fingerprints)

    @property
    def already_upstream(self) -> bool:
        if self.effect is not None:
            return self.effect
        return all(self.fingerprints)


def match_upstream(repo: Git, patch: Patch, rev: str = UPSTREAM_TAG) -> UpstreamMatch:
    texts: dict[str, str] = {}

    def text(path: str) -> str:
        if path not in texts:
            texts[path] = text_at(repo, path, rev)
        return texts[path]

    def found(eff: Fingerprint) -> bool:
        if "*" not in eff.path:
            return eff.found_in(text(eff.path))
        prefix = eff.path.split("*", 1)[0].rpartition("/")[0]
        names = repo.files(rev, under=prefix)
        return any(eff.found_in(text(n)) for n in names if fnmatch.fnmatchcase(n, eff.path))

    fingerprints = tuple(fingerprint_in(fp, text(fp.path)) for fp in patch.fingerprints)
    evidence: list[str] = []
    effect: bool | None = None
    if patch.effects or patch.effects_absent:
        effect = True
        for eff in patch.effects:
            hit = found(eff)
            effect &= hit
            evidence.append(f"Effect {eff}: {'present' if hit else 'ABSENT'}")
        for eff in patch.effects_absent:
            hit = found(eff)
            effect &= not hit
            evidence.append(f"Effect-Absent {eff}: {'PRESENT' if hit else 'absent'}")
    else:
        evidence = [f"Fingerprint {fp}: {'present' if hit else 'absent'}"
                    for fp, hit in zip(patch.fingerprints, fingerprints, strict=True)]
    return UpstreamMatch(fingerprints=fingerprints, effect=effect, evidence=tuple(evidence))


def fingerprints_at(repo: Git, patch: Patch, rev: str = UPSTREAM_TAG
                    ) -> list[tuple[Fingerprint, bool]]:
    return list(zip(patch.fingerprints, match_upstream(repo, patch, rev).fingerprints,
                    strict=True))


def applied_upstream_version(patch: Patch) -> Version | None:
    """The release named first in ``Applied-Upstream`` (``0.6.17, <url>``)."""
    token = re.split(r"[,\s]+", patch.applied_upstream.strip(), maxsplit=1)[0]
    try:
        return Version(token.removeprefix("v")) if token else None
    except InvalidVersion:
        return None
