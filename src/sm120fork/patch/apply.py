"""Apply a series as commits, exactly or not at all: checked on a scratch index first, then
``git am`` without fuzz or 3-way; a failure rolls back and names the patch and hunk."""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass

from sm120fork.errors import CommandError, PatchError
from sm120fork.fetch.source import UPSTREAM_TAG
from sm120fork.patch.series import Patch, Series
from sm120fork.util.git import Git
from sm120fork.util.hint import command

log = logging.getLogger("sm120fork")

_FAILED = re.compile(r"patch failed: (\S+?):(\d+)")
_MISSING = re.compile(r"(?:error: )?(\S+): (?:does not exist in index|No such file or directory)")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class ApplyFailure:
    patch: str
    file: str
    hunk: str
    message: str


def _locate(patch: Patch, output: str) -> tuple[str, str]:
    m = _FAILED.search(output)
    if m:
        file, line = m.group(1), int(m.group(2))
        text = patch.path.read_text(encoding="utf-8", errors="replace")
        section = text.split(f"diff --git a/{file} b/{file}", 1)
        if len(section) == 2:
            body = section[1].split("\ndiff --git ", 1)[0]
            for number, hm in enumerate(_HUNK.finditer(body), 1):
                if int(hm.group(1)) == line:
                    # Quoted: the header's context often holds a lone "(" of the code.
                    return file, f"hunk #{number} `{hm.group(0).strip()}`"
        return file, f"hunk at line {line}"
    m2 = _MISSING.search(output)
    if m2:
        return m2.group(1), "file missing in the source"
    return (patch.files[0] if patch.files else "?"), "unknown hunk"


def check_series(repo: Git, series: Series) -> list[ApplyFailure]:
    """Dry-run the series on a scratch index; the work tree and index stay untouched."""
    failures: list[ApplyFailure] = []
    fd, index = tempfile.mkstemp(prefix="sm120fork-index.")
    os.close(fd)
    env = {"GIT_INDEX_FILE": index}
    try:
        repo("read-tree", UPSTREAM_TAG, env=env)
        for p in series.patches:
            try:
                repo("apply", "--cached", "--check", str(p.path), env=env)
            except CommandError as exc:
                file, hunk = _locate(p, exc.detail or "")
                failures.append(ApplyFailure(patch=p.name, file=file, hunk=hunk,
                                             message=(exc.detail or "").strip()))
                break
            repo("apply", "--cached", str(p.path), env=env)
    finally:
        os.unlink(index)
    return failures


def reset_to_upstream(repo: Git) -> None:
    if repo.am_in_progress():
        repo("am", "--abort")
    repo("checkout", "-q", "-B", "main", UPSTREAM_TAG)
    repo("reset", "-q", "--hard", UPSTREAM_TAG)
    repo("clean", "-q", "-fdx")


def apply_series(repo: Git, series: Series, *, stack: str, project: str,
                 upto: int | None = None) -> str:
    patches = series.patches if upto is None else series.patches[:upto]
    partial = Series(directory=series.directory, patches=patches)
    failures = check_series(repo, partial)
    if failures:
        f = failures[0]
        raise PatchError(
            f"patch {f.patch} does not apply exactly: {f.file}, {f.hunk}",
            where=f"stack {stack}, project {project}",
            fix="rebase the patch on the pinned upstream (its fork tree's commit, exported "
                f"by `{command('refresh', stack, project)}`) and build again",
            detail=f.message)
    reset_to_upstream(repo)
    for p in patches:
        try:
            repo.am([p.path], extra=("--committer-date-is-author-date",))
        except CommandError as exc:
            file, hunk = _locate(p, exc.detail or "")
            reset_to_upstream(repo)
            raise PatchError(f"patch {p.name} does not apply exactly: {file}, {hunk}",
                             where=f"stack {stack}, project {project}",
                             detail=exc.detail) from exc
    return repo.head()
