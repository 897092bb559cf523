"""Classify a patch against a new upstream, and preview a whole series."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence

from packaging.version import Version

from sm120fork.errors import CommandError
from sm120fork.fetch.kinds import UPSTREAM_TAG
from sm120fork.maintain.state import (
    CONFLICT,
    MERGES_UNCHECKED,
    STILL_NEEDED,
    TARGET_MISSING,
    UPSTREAMED_DIFFERENTLY,
    UPSTREAMED_IDENTICALLY,
    Classification,
)
from sm120fork.patch.series import Patch, applied_upstream_version, match_upstream, text_at
from sm120fork.util.git import Git

MERGES_3WAY = "but a 3-way merge applies it: the bump checks what it makes"
#: A line the patch removes counts as the code it changes only when it is this long
#: (stripped), and as found elsewhere only in at most this many files of the release.
_MOVED_MIN_CHARS = 8
_MOVED_MAX_FILES = 5


def _removed_lines(patch: Patch) -> dict[str, list[str]]:
    """The lines each file's hunks remove (stripped, long enough to mean something)."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in patch.path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("diff --git "):
            current = line.rpartition(" b/")[2]
        elif current and line.startswith("-") and not line.startswith("--- "):
            text = line[1:].strip()
            if len(text) >= _MOVED_MIN_CHARS and text not in out.setdefault(current, []):
                out[current].append(text)
    return out


def moved_code(repo: Git, patch: Patch, new_version: Version) -> list[str]:
    """Where the code a conflicting patch changes went, when it left the file the patch
    names (a release that split a module)."""
    found: list[str] = []
    for path, lines in _removed_lines(patch).items():
        here = text_at(repo, path)
        gone = [line for line in lines if line not in here]
        if not gone or len(gone) < len(lines) / 2:
            continue  # most of it is still there: an ordinary conflict
        hits: Counter[str] = Counter()
        for line in gone[:8]:
            try:
                out = repo("grep", "-F", "-l", "-e", line, UPSTREAM_TAG, "--")
            except CommandError:  # not found anywhere
                continue
            names = [n.partition(":")[2] for n in out.splitlines() if n.strip()]
            if len(names) <= _MOVED_MAX_FILES:
                hits.update(names)
        best = sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        if best:
            found.append(
                f"the code it changes in {path} is not there in {new_version}: "
                + ", ".join(f"{n} has {k} of its {len(gone)} line(s)" for n, k in best)
                + " (moved upstream? resolve it there)")
    return found


def _applies(repo: Git, patch: Patch, env: Mapping[str, str] | None, *extra: str) -> bool:
    where = ("--cached",) if env else ()
    try:
        repo("apply", "--check", *where, *extra, str(patch.path), env=env)
    except CommandError:
        return False
    return True


def classify(repo: Git, patch: Patch, new_version: Version,
             env: Mapping[str, str] | None = None) -> tuple[str, list[str]]:
    """Classify one patch against the work tree (or, with ``env``, a scratch index);
    fingerprints and effects are looked up in the new upstream itself."""
    match = match_upstream(repo, patch)
    if _applies(repo, patch, env):
        n = match.fingerprints_present
        return STILL_NEEDED, ["applies exactly", f"but {n} fingerprint(s) already upstream: "
                              "the artifact check will fail; review the patch and its "
                              "fingerprint" if n else "fingerprint absent upstream"]
    if _applies(repo, patch, env, "--reverse"):
        return UPSTREAMED_IDENTICALLY, ["does not apply; reverse-applies cleanly"]
    evidence = ["does not apply, does not reverse-apply", *match.evidence]
    missing = [f for f in patch.changed_files if not repo.exists("HEAD", f)]
    if missing:
        return TARGET_MISSING, [*evidence, f"not in {new_version}: {', '.join(missing)} "
                                           "(moved or removed upstream)"]
    if not match.already_upstream:
        return CONFLICT, [*evidence, "effect absent upstream",
                          *moved_code(repo, patch, new_version)]
    claimed = applied_upstream_version(patch)
    if claimed is not None and claimed > new_version:
        return CONFLICT, [*evidence, f"but Applied-Upstream names {claimed}, later than "
                          f"{new_version}: check by hand"]
    return UPSTREAMED_DIFFERENTLY, [*evidence, "no Applied-Upstream field" if claimed is None
                                    else f"Applied-Upstream {claimed} <= {new_version}: agrees"]


def classification(patch: Patch, verdict: str, evidence: Sequence[str]) -> Classification:
    return Classification(patch=patch.name, subject=patch.subject, verdict=verdict,
                          evidence=tuple(evidence), applied_upstream=patch.applied_upstream)


def preview(repo: Git, patches: Sequence[Patch], new_version: Version) -> list[Classification]:
    """Every patch classified before anything is applied, each on top of the earlier
    ones that apply (or merge): a conflict does not stop the preview."""
    results: list[Classification] = []
    with tempfile.TemporaryDirectory(prefix="sm120fork-bump-index.") as tmp:
        index, trial = f"{tmp}/index", f"{tmp}/index.3way"  # the work tree stays untouched
        env = {"GIT_INDEX_FILE": index}
        repo("read-tree", "HEAD", env=env)
        for patch in patches:
            verdict, evidence = classify(repo, patch, new_version, env)
            if verdict == STILL_NEEDED:
                repo("apply", "--cached", str(patch.path), env=env)
            elif verdict in (CONFLICT, TARGET_MISSING):
                shutil.copyfile(index, trial)
                try:
                    repo("apply", "--cached", "--3way", str(patch.path),
                         env={"GIT_INDEX_FILE": trial})
                except CommandError:
                    evidence.append("a 3-way merge conflicts too: the bump stops here")
                else:
                    os.replace(trial, index)
                    verdict, evidence = MERGES_UNCHECKED, [*evidence, MERGES_3WAY]
            results.append(classification(patch, verdict, evidence))
    return results
