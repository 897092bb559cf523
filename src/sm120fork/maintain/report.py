"""What a finished bump writes: ``reports/bump/*.md`` and ``patches/<stack>/CHANGELOG.md``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from sm120fork.declare import Project, WheelPin
from sm120fork.fetch.kinds import source_kind
from sm120fork.maintain.state import (
    DROPPED_BY_HAND,
    RESOLVED,
    UPSTREAMED,
    BumpState,
    Classification,
    today,
)
from sm120fork.patch.refresh import RefreshResult
from sm120fork.util.portable import markdown_table
from sm120fork.workspace import Workspace


def report_file(ws: Workspace, stack: str, project: str, old: str, new: str) -> Path:
    return ws.reports_dir / "bump" / f"{stack}-{project}-{old}-to-{new}.md"


def report_path(ws: Workspace, state: BumpState) -> Path:
    return report_file(ws, state.stack, state.project, state.old_version, state.new_version)


def _table(results: Sequence[Classification]) -> list[str]:
    return markdown_table(("patch", "subject", "verdict", "Applied-Upstream", "evidence"), (
        (r.patch, r.subject, f"**{r.verdict}**", r.applied_upstream or "-",
         "<br>".join(r.evidence)) for r in results))


def verdict_counts(verdicts: Iterable[str]) -> str:
    """``6 upstreamed differently; 2 conflict``: how many patches got each verdict."""
    counts = Counter(verdicts)
    return "; ".join(f"{n} {verdict}" for verdict, n in counts.items()) or "no patches"


def preview_lines(state: BumpState) -> list[str]:
    """The preview, one patch a line (the evidence is in the report)."""
    preview = state.preview
    counts = verdict_counts(r.verdict for r in preview)
    return [f"before applying, against {state.new_version}: {counts}",
            *(f"  {r.patch}: {r.verdict}" for r in preview)]


def outcome_lines(project: Project, old_version: str, new_version: str,
                  results: Sequence[Classification], kept: int,
                  published: Sequence[WheelPin], moves: Sequence[str] = ()) -> list[str]:
    """What the finished bump did: the report's summary and the console's."""
    dropped = [r for r in results if r.verdict in (*UPSTREAMED, DROPPED_BY_HAND)]
    lines = [f"{project.key} {old_version} -> {new_version}: "
             f"{verdict_counts(r.verdict for r in results)}",
             f"{len(dropped)} patch(es) left the series, {kept} kept",
             *(f"moved: {line}" for line in moves)]
    if published:
        lines.append(f"the series is empty: the stack ships {project.distribution} "
                     f"{new_version} as published ("
                     + ", ".join(w.filename for w in published) + ")")
    return lines


def _pin_lines(project: Project) -> list[str]:
    lines = []
    if project.sdist is not None:
        lines.append(f"- sdist: `{project.sdist.filename}` sha256 `{project.sdist.sha256}` "
                     "(from the package index listing; the download was checked against it)")
    if source_kind(project.source).ships_wheels:
        lines += [f"- wheel: `{w.filename}` sha256 `{w.sha256}` (from the package index "
                  "listing)" for w in project.wheels]
    git = project.git
    lines.append(f"- git: {git.url} tag `{git.tag}` commit `{git.commit}` "
                 f"({'verified' if git.commit_verified else 'unverified'}"
                 f"{': ' + git.note if git.note else ''})" if git is not None else
                 "- git: none (the wheels record no commit; pass --git-commit to pin one)")
    return lines


def write_bump_report(ws: Workspace, state: BumpState, project: Project, *,
                      results: Sequence[Classification] = (), range_diff: str = "",
                      refreshed: RefreshResult | None = None, stopped: str = "",
                      published: Sequence[WheelPin] = (), remake: Sequence[str] = ()) -> Path:
    """The bump's report: written before any patch is applied, at a stop, and at the end."""
    path = report_path(ws, state)
    new_project = state.pinned(project)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Bump {project.distribution} {state.old_version} -> {state.new_version} "
        f"(stack {state.stack})", "",
        f"Date: {today()}. Command: `{state.command}`"
        + (" (conflicts resolved by hand, then `--continue`)." if any(
            r.verdict in (RESOLVED, DROPPED_BY_HAND) for r in results) else "."), "",
        "## New pin", "", *_pin_lines(new_project),
        f"- source used to build: {new_project.source}", "",
        f"## Before applying: each patch against {state.new_version}", "",
        "Classified before anything was applied; a conflict does not hide the patches "
        "after it (each is checked on top of the earlier ones that apply).", "",
        *_table(state.preview), ""]
    if stopped or refreshed is None:
        lines += ["## Status", "", stopped or "in progress", ""]
        path.write_text("\n".join(lines), encoding="utf-8")
        return path
    kept = len(refreshed.added) + len(refreshed.changed) + len(refreshed.unchanged)
    summary = outcome_lines(project, state.old_version, state.new_version, results, kept,
                            published, list(state.moves.values()))
    lines[lines.index("## New pin"):lines.index("## New pin")] = [
        "## Summary", "", *(f"- {line}" for line in summary), ""]
    lines += ["## Classification (as applied)", "", *_table(results)]
    left = [f"- {r.patch} ({r.subject}): " + (f"{r.verdict} in {state.new_version}"
                                              if r.verdict in UPSTREAMED
                                              else "dropped at its conflict (--skip)")
            + (f"; upstream: {r.applied_upstream}" if r.applied_upstream else "")
            for r in results if r.verdict in (*UPSTREAMED, DROPPED_BY_HAND)]
    lines += ["", "## Left the series", "", *(left or ["None."])]
    lines += ["", "## Series after the bump", "",
              f"Directory `{Path(state.series_dir).relative_to(ws.root)}`: {kept} "
              f"patch(es); added {len(refreshed.added)}, removed {len(refreshed.removed)}, "
              f"changed {len(refreshed.changed)}, unchanged {len(refreshed.unchanged)}.", ""]
    lines += [f"- {n}" for n in (*refreshed.added, *refreshed.changed, *refreshed.unchanged)]
    if published:
        lines += ["", f"Used as published: with no patch left, the stack ships "
                      f"{project.distribution} {state.new_version} unchanged (no local "
                      "label, no rebuild); the declaration pins its wheels:", "",
                  *(f"- `{w.filename}` sha256 `{w.sha256}`" for w in published)]
    lines += ["", "## Evidence to re-make", "",
              *evidence_lines(state.stack, state.created_stack, remake)]
    lines += ["", "## Range-diff (series before -> after)", "",
              "`git range-diff before-base..before upstream..HEAD` in the fork tree:", "",
              "```", range_diff.rstrip() or "(empty: no patch left on either side)", "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def evidence_lines(stack: str, created: bool, remake: Sequence[str]) -> list[str]:
    """What the bump's console and report say of the claims (``standing.to_remake``)."""
    head = (f"Stack {stack} is new: its patches' claims name checks, not stacks, so each "
            f"is carried to {stack}'s own records, which these commands make:"
            if created else
            f"The claims no passing record of {stack} backs, by the command that makes it:")
    return [head, *(f"- {line}" for line in remake)] if remake else [
        f"None: a passing record of {stack} backs every claim."]


def write_changelog(ws: Workspace, state: BumpState, project: Project, report: Path,
                    published: Sequence[WheelPin] = ()) -> Path:
    path = ws.root / "patches" / state.stack / "CHANGELOG.md"
    title = f"# Patch series changelog: stack {state.stack}\n"
    old = path.read_text(encoding="utf-8") if path.is_file() else title
    entry = [f"## {today()}: {project.key} {state.old_version} -> {state.new_version}", ""]
    for r in state.results:
        if r.verdict in UPSTREAMED:
            pr = f" (Applied-Upstream: {r.applied_upstream})" if r.applied_upstream else ""
            entry.append(f"- dropped {r.patch} ({r.subject}): {r.verdict} in "
                         f"{project.distribution} {state.new_version}{pr}")
        elif r.verdict == DROPPED_BY_HAND:
            entry.append(f"- dropped {r.patch} ({r.subject}) at its conflict with "
                         f"{project.distribution} {state.new_version} (--skip)")
        else:
            entry.append(f"- kept {r.patch}: {r.verdict}")
    entry += [f"- moved {line}" for line in state.moves.values()]
    if published:
        entry.append(f"- the series is empty: {project.distribution} {state.new_version} "
                     "is used as published")
    entry += ["", f"Report: {report.relative_to(ws.root)}", ""]
    head, _, rest = old.partition("\n")
    body = rest.lstrip("\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{head}\n\n" + "\n".join(entry) + ("\n" + body if body else ""),
                    encoding="utf-8")
    return path
