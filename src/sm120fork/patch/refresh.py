"""``refresh``: export a fork tree's commits back into its series, byte-stable (the dates
set to each patch's ``Last-Update``); a refresh with no change writes nothing."""

from __future__ import annotations

import datetime as dt
import email.utils
import itertools
import json
import os
import re
import shlex
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sm120fork.errors import CommandError, SeriesError
from sm120fork.fetch.kinds import UPSTREAM_TAG
from sm120fork.patch.series import Series, load_series, parse_patch, read_series_file
from sm120fork.util.files import atomic_write_text, read_json_object, sha256_file
from sm120fork.util.git import Git
from sm120fork.workspace import Workspace

#: The canonical export (patches/README.md); refresh writes exactly this.
FORMAT_PATCH = ("format-patch", "--zero-commit", "--no-signature", "--full-index",
                "--no-numbered", "--stat=80", "--stat-graph-width=20")


@dataclass(frozen=True, kw_only=True)
class RefreshResult:
    stack: str
    project: str
    directory: Path
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    series_rewritten: bool

    @property
    def wrote_anything(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.series_rewritten)

    @cached_property
    def series(self) -> Series:
        return load_series(self.directory)

    @property
    def paths(self) -> list[Path]:
        return [self.directory / name for name in (
            "series", *self.added, *self.changed, *self.unchanged, *self.removed)]


def export_series(repo: Git, directory: Path, stack: str, project: str) -> RefreshResult:
    """Write the fork tree's commits as the series in ``directory``; touch only changes."""
    with tempfile.TemporaryDirectory(prefix="sm120fork-refresh-") as tmp:
        out = repo(*FORMAT_PATCH, "-o", tmp, f"{UPSTREAM_TAG}..HEAD")
        exported = [Path(line) for line in out.splitlines() if line.strip()]
        commits = repo.commits(f"{UPSTREAM_TAG}..HEAD")
        new: dict[str, str] = {}
        for path, commit in zip(exported, commits, strict=True):
            text = path.read_text(encoding="utf-8")
            try:
                patch = parse_patch(path)  # refuses a commit without a DEP-3 header
            except SeriesError as exc:  # name the commit, not the scratch file it went to
                raise SeriesError(
                    f"commit {commit.hexsha[:12]} ({commit.summary!r}) cannot become a patch: "
                    f"{exc.what}", where=str(repo.path),
                    fix=f"correct its message's DEP-3 header (patches/README.md): `git -C "
                        f"{shlex.quote(str(repo.path))} rebase -i {UPSTREAM_TAG}` and reword it") \
                    from None
            day = dt.datetime.fromisoformat(patch.field("Last-Update")).replace(tzinfo=dt.UTC)
            new[path.name] = re.sub(r"^Date: .*$", f"Date: {email.utils.format_datetime(day)}",
                                    text, count=1, flags=re.MULTILINE)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        old_names = read_series_file(directory)
    except SeriesError:  # no series file yet, or one that refresh is about to replace
        old_names = []
    on_disk = {p.name for p in directory.glob("*.patch")}
    have = {n: (directory / n).read_bytes() for n in new if n in on_disk}
    unchanged = [n for n in new if have.get(n) == new[n].encode("utf-8")]
    changed = [n for n in new if n in have and n not in unchanged]
    added = [n for n in new if n not in have]
    for name in (*changed, *added):
        atomic_write_text(directory / name, new[name])
    removed = sorted((on_disk | set(old_names)) - set(new))
    for name in removed:
        (directory / name).unlink(missing_ok=True)
    series_file = directory / "series"
    rewritten = old_names != list(new) or not series_file.is_file()
    if rewritten:
        old = series_file.read_text(encoding="utf-8") if series_file.is_file() else ""
        header = itertools.takewhile(lambda line: line.startswith("#") or not line.strip(),
                                     old.splitlines())
        series_file.write_text("".join(f"{h}\n" for h in header)
                               + "".join(f"{n}\n" for n in new), encoding="utf-8")
    return RefreshResult(stack=stack, project=project, directory=directory,
                         added=tuple(added), removed=tuple(removed), changed=tuple(changed),
                         unchanged=tuple(unchanged), series_rewritten=rewritten)


#: The sha256 of each series file as the toolkit last wrote it (None: removed).
WRITTEN = "written.json"


def note_written(ws: Workspace, paths: Iterable[Path]) -> None:
    """Remember what the toolkit wrote, to tell it from edits made by hand."""
    stamp = ws.state_dir / WRITTEN
    known = read_json_object(stamp) or {}
    for path in paths:
        known[path.relative_to(ws.root).as_posix()] = (
            sha256_file(path) if path.is_file() else None)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stamp, json.dumps(known, indent=1, sort_keys=True) + "\n")


def uncommitted_series_files(ws: Workspace, directory: Path) -> list[str]:
    """Files under ``directory`` changed since the last commit, and not by the toolkit."""
    try:
        checkout = Git(ws.root)
    except CommandError:
        return []
    rel = os.path.relpath(directory, ws.root)
    out = checkout("status", "--porcelain", "--untracked-files=all", "--", rel, strip=False)
    top = Path(checkout("rev-parse", "--show-toplevel")).resolve()
    known = read_json_object(ws.state_dir / WRITTEN) or {}
    edited = []
    for name in (line[3:] for line in out.splitlines() if line.strip()):
        path = top / name
        key = os.path.relpath(path, ws.root.resolve()).replace(os.sep, "/")
        if key not in known or known[key] != (sha256_file(path) if path.is_file() else None):
            edited.append(name)
    return edited
