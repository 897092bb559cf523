"""What a finished bump writes: ``reports/bump/*.md`` and ``patches/<stack>/CHANGELOG.md``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sm120fork.declare import Project, Stack
from sm120fork.maintain.state import (
    DROPPED_BY_HAND,
    RESOLVED,
    UPSTREAMED,
    BumpState,
    Classification,
    today,
)
from sm120fork.patch.refresh import RefreshResult
from sm120fork.workspace import Workspace


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report_path(ws: Workspace, state: BumpState) -> Path:
    return (ws.reports_dir / "bump" /
            f"{state.stack}-{state.project}-{state.old_version}-to-{state.new_version}.md")


def _table(results: Sequence[Classification]) -> list[str]:
    lines = ["| patch | subject | verdict | Applied-Upstream | evidence |",
             "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {_md_escape(r.patch)} | {_md_escape(r.subject)} | **{r.verdict}** | "
                     f"{_md_escape(r.applied_upstream) or '-'} | "
                     f"{'<br>'.join(_md_escape(e) for e in r.evidence)} |")
    return lines


def preview_lines(state: BumpState) -> list[str]:
    """The look-before-you-leap preview as plain text, one patch a line."""
    return [f"before applying, against {state.new_version}:",
            *(f"  {r.patch}: {r.verdict} ({'; '.join(r.evidence)})"
              for r in state.classifications("preview"))]


def write_bump_report(ws: Workspace, stack: Stack, project: Project, state: BumpState,
                      new_project: Project, *, results: Sequence[Classification] = (),
                      range_diff: str = "", refreshed: RefreshResult | None = None,
                      stopped: str = "") -> Path:
    """The bump's report: written before any patch is applied, again at a conflict, and
    complete when the bump finishes."""
    path = report_path(ws, state)
    path.parent.mkdir(parents=True, exist_ok=True)
    git = new_project.git_pin
    lines = [
        f"# Bump {project.distribution} {state.old_version} -> {state.new_version} "
        f"(stack {stack.name})", "",
        f"Date: {today()}. Command: `{state.command}`"
        + (" (conflicts resolved by hand, then `--continue`)." if any(
            r.verdict in (RESOLVED, DROPPED_BY_HAND) for r in results) else "."), "",
        "## New pin", "",
        f"- sdist: `{new_project.sdist_pin.filename}` sha256 `{new_project.sdist_pin.sha256}` "
        "(from the package index listing; the download was checked against it)",
        f"- git: {git.url} tag `{git.tag}` commit `{git.commit}` "
        f"({'verified' if git.commit_verified else 'unverified'}"
        f"{': ' + git.note if git.note else ''})",
        f"- source used to build: {new_project.source}", "",
        f"## Before applying: each patch against {state.new_version}", "",
        "Classified before anything was applied; a conflict does not hide the patches "
        "after it (each is checked on top of the earlier ones that apply).", "",
        *_table(state.classifications("preview")), ""]
    if stopped or refreshed is None:
        lines += ["## Status", "", stopped or "in progress", ""]
        path.write_text("\n".join(lines), encoding="utf-8")
        return path
    lines += ["## Classification (as applied)", "", *_table(results)]
    dropped = [r for r in results if r.verdict in UPSTREAMED]
    lines += ["", "## Left the series (upstreamed)", ""]
    if dropped:
        for r in dropped:
            lines.append(f"- {r.patch} ({r.subject}): {r.verdict} in {state.new_version}"
                         f"{'; upstream: ' + r.applied_upstream if r.applied_upstream else ''}")
    else:
        lines.append("None.")
    lines += ["", "## Series after the bump", "",
              f"Directory `{Path(state.series_dir).relative_to(ws.root)}`: "
              f"{len(refreshed.added) + len(refreshed.changed) + len(refreshed.unchanged)} "
              f"patch(es); added {len(refreshed.added)}, removed {len(refreshed.removed)}, "
              f"changed {len(refreshed.changed)}, unchanged {len(refreshed.unchanged)}.", ""]
    lines += [f"- {n}" for n in (*refreshed.added, *refreshed.changed, *refreshed.unchanged)]
    lines += ["", "## Range-diff (series before -> after)", "",
              "`git range-diff before-base..before upstream..HEAD` in the fork tree:", "",
              "```", range_diff.rstrip() or "(empty: no patch left on either side)", "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_changelog(ws: Workspace, stack: Stack, project: Project, state: BumpState,
                    results: Sequence[Classification], report: Path) -> Path:
    path = ws.root / "patches" / stack.name / "CHANGELOG.md"
    title = f"# Patch series changelog: stack {stack.name}\n"
    old = path.read_text(encoding="utf-8") if path.is_file() else title
    entry = [f"## {today()}: {project.key} {state.old_version} -> {state.new_version}", ""]
    for r in results:
        if r.verdict in UPSTREAMED:
            pr = _applied_upstream_url_text(r.applied_upstream)
            entry.append(f"- dropped {r.patch} ({r.subject}): {r.verdict} in "
                         f"{project.distribution} {state.new_version}{pr}")
        elif r.verdict == DROPPED_BY_HAND:
            entry.append(f"- dropped {r.patch} ({r.subject}) during conflict resolution")
        else:
            entry.append(f"- kept {r.patch}: {r.verdict}")
    entry += ["", f"Report: {report.relative_to(ws.root)}", ""]
    head, _, rest = old.partition("\n")
    body = rest.lstrip("\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{head}\n\n" + "\n".join(entry) + ("\n" + body if body else ""),
                    encoding="utf-8")
    return path


def _applied_upstream_url_text(field: str) -> str:
    if not field:
        return ""
    return f" (Applied-Upstream: {field})"


