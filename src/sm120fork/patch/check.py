"""Check what a series made of a fork tree before a stage says yes: every Python file it
touches compiled, every module imported under the fake-GPU probe at 12.0 and 9.0 with the
global names on added lines looked up (a missing one fails at a call, not at import)."""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120fork.errors import CommandError, VerifyError
from sm120fork.fetch.kinds import UPSTREAM_TAG
from sm120fork.harness.fake_gpu import GPU_ONLY_PACKAGES
from sm120fork.layouts import adapter
from sm120fork.layouts.results import REQUIREMENTS, run_probe
from sm120fork.patch.series import Patch
from sm120fork.util.git import Git

CAPABILITIES = ("12.0", "9.0")
PROBE = "sm120fork.harness.imports"
_INSTALL = f"install the probe's requirements into {sys.executable}: {REQUIREMENTS}"


@dataclass(frozen=True, kw_only=True)
class CheckFailure:
    patch: str
    #: ``file:line`` relative to the tree (``file:0`` when no line is known).
    where: str
    error: str
    check: str

    def __str__(self) -> str:
        return f"{self.patch}: {self.where}: {self.error} ({self.check})"


@dataclass(frozen=True, kw_only=True)
class TreeCheck:
    compiled: tuple[str, ...]
    not_compiled: tuple[str, ...]
    imported: tuple[str, ...]
    not_imported: tuple[str, ...]
    failures: tuple[CheckFailure, ...]
    #: Names on the added lines were looked up (the tree tags its release).
    names: bool = False

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def summary(self) -> str:
        parts = [f"compiled {len(self.compiled)} Python file(s) the series touches"]
        if self.imported:
            parts.append(f"imported {len(self.imported)} patched module(s) under the "
                         f"fake-GPU probe at capability {' and '.join(CAPABILITIES)}"
                         + (" and looked up the global names their functions use on "
                            "the lines the series added" if self.names else ""))
        if self.not_compiled:
            parts.append(f"{len(self.not_compiled)} other file(s) not compiled here")
        whys = Counter(line.partition(" (")[2].rstrip(")") for line in self.not_imported)
        parts += [f"{n} file(s) not imported ({why})" for why, n in whys.items()]
        return "; ".join(parts)


def _owner(tree: Path, patches: Sequence[Patch], path: str, line: int = 0) -> str:
    """The patch whose commit last changed ``path`` at ``line`` (git blame, by subject);
    else the last patch that changes ``path``."""
    if line:
        with contextlib.suppress(CommandError):
            blame = Git(tree)("blame", "--porcelain", "-L", f"{line},{line}", "--", path)
            subject = next((b[8:] for b in blame.splitlines() if b.startswith("summary ")), "")
            if found := next((p.name for p in patches if p.subject == subject), ""):
                return found
    return next((p.name for p in reversed(patches) if path in p.files), patches[-1].name)


def fold_steps(tree: Path, patches: Sequence[Patch], name: str) -> str:
    """The commands that fold a fix made in ``tree`` into patch ``name``'s commit (so
    ``refresh`` mends it, not adds one); "" when no commit has its subject."""
    subject = next((p.subject for p in patches if p.name == name), "")
    with contextlib.suppress(CommandError):
        for row in Git(tree)("log", "--format=%H %s", f"{UPSTREAM_TAG}..HEAD").splitlines():
            sha, _, said = row.partition(" ")
            if subject and said == subject:
                git = ["git", "-C", str(tree)]
                return (f"`{shlex.join([*git, 'commit', '-a', '--fixup', sha])}`, then `"
                        + shlex.join([*git, "-c", "sequence.editor=true", "rebase", "-i",
                                      "--autosquash", UPSTREAM_TAG]) + "`")
    return ""


def _module(tree: Path, rel: str) -> tuple[str, Path] | str:
    """(module name, package root), or why it is not imported.  The outermost folder with
    an ``__init__.py`` is the package (SGLang's subpackages are namespace packages)."""
    parts = Path(rel).with_suffix("").parts
    top = next((i for i in range(len(parts) - 1)
                if (tree.joinpath(*parts[:i + 1]) / "__init__.py").is_file()), None)
    if top is None:
        return f"{rel} (not in a package)"
    names = [*parts[top:-1], *([] if parts[-1] == "__init__" else [parts[-1]])]
    if names[0] in GPU_ONLY_PACKAGES:
        return f"{rel} ({names[0]} is stubbed by the fake-GPU probe)"
    return ".".join(names), tree.joinpath(*parts[:top])


def check_tree(tree: Path, patches: Sequence[Patch], *, layout: str = "",
               cache: Path) -> TreeCheck:
    """VerifyError when the probe cannot run (a requirement missing from this Python)."""
    files = [f for f in dict.fromkeys(f for p in patches for f in p.files)
             if (tree / f).is_file()]
    failures: list[CheckFailure] = []
    compiled, not_imported = [], []
    not_compiled = [f for f in files if not f.endswith(".py")]
    modules: dict[str, str] = {}
    roots: dict[Path, None] = {}
    for rel in (f for f in files if f.endswith(".py")):
        try:
            compile((tree / rel).read_bytes(), rel, "exec", dont_inherit=True)
        except SyntaxError as exc:
            failures.append(CheckFailure(patch=_owner(tree, patches, rel, exc.lineno or 0),
                                         where=f"{rel}:{exc.lineno or 0}",
                                         error=f"SyntaxError: {exc.msg}", check="compile"))
            continue
        compiled.append(rel)
        found = _module(tree, rel)
        if isinstance(found, str):
            not_imported.append(found)
        else:
            modules[found[0]] = rel
            roots[found[1]] = None
    added = None
    if modules and not failures:
        added = _added_lines(tree, list(modules.values()))
        path = [*map(str, roots)]
        failed, missing = _imports(tree, patches, modules, path, added or {})
        # The layout's overlay (its release's own pins) goes first on the path only when the
        # imports need more than this Python has (installing it needs the index).
        if (missing or any(f.error.startswith("ImportError") for f in failed)) and (
                extra := adapter(layout).probe_path(cache, sys.executable) if layout else []):
            failed, missing = _imports(tree, patches, modules, [*extra, *path], added or {})
        if missing:
            raise VerifyError(f"the import probe could not run: this Python lacks {missing!r} "
                              "(a requirement of the probe, not of the patched code)",
                              where=sys.executable, fix=_INSTALL)
        failures += failed
    return TreeCheck(compiled=tuple(compiled), not_compiled=tuple(not_compiled),
                     imported=tuple(modules), not_imported=tuple(not_imported),
                     failures=tuple(failures), names=added is not None)


def _added_lines(tree: Path, files: Sequence[str]) -> dict[str, list[int]] | None:
    """file -> the lines the series added; None when the tree tags no release."""
    try:
        diff = Git(tree)("diff", "-U0", "--no-color", "--no-ext-diff", UPSTREAM_TAG, "--",
                         *files)
    except CommandError:
        return None
    out: dict[str, list[int]] = {}
    current = ""
    for line in diff.splitlines():
        if line.startswith("+++ "):
            current = line.removeprefix("+++ b/")
        elif (hunk := re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)) and current:
            start = int(hunk[1])
            out.setdefault(current, []).extend(range(start, start + int(hunk[2] or 1)))
    return out


def _imports(tree: Path, patches: Sequence[Patch], modules: dict[str, str], path: list[str],
             added: dict[str, list[int]]) -> tuple[list[CheckFailure], str]:
    """The failures at each capability, and a module neither the tree nor this Python has."""
    env = {"PYTHONDONTWRITEBYTECODE": "1"}  # the fork tree stays clean
    failures: dict[tuple[str, str], CheckFailure] = {}
    for cap in CAPABILITIES:
        request = {"capability": [int(c) for c in cap.split(".")], "tree": str(tree),
                   "modules": list(modules),
                   "added": {m: added.get(rel, []) for m, rel in modules.items()}}
        what = f"the import probe (capability {cap})"
        seen = run_probe(PROBE, request, tree=tree, path=path, env=env, python=sys.executable,
                         timeout=600, what=what, fix=_INSTALL)
        for obs in seen:
            if obs.observed == "missing":
                return [], obs.detail
            if obs.observed != "ok":
                where, _, error = obs.detail.partition(": ")
                file, _, line = where.rpartition(":")
                owner = _owner(tree, patches, file, int(line)) if any(
                    file in p.files for p in patches) else _owner(tree, patches, modules[obs.name])
                failures.setdefault((where, error), CheckFailure(
                    patch=owner, where=where or f"{modules[obs.name]}:0", error=error,
                    check=f"{'names' if obs.observed == 'undefined' else 'import'} "
                          f"{obs.name} at capability {cap}"))
    return list(failures.values()), ""
