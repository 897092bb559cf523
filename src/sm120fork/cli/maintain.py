"""``status``, ``bump``, ``refresh``, ``watch``, ``upstream-pr``: rendering only."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
from collections.abc import Sequence

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from rich.console import Console
from rich.table import Table

from sm120fork.cli.args import WIDE_MIN_WIDTH, bump_revision
from sm120fork.cli.output import say, table
from sm120fork.errors import EXIT_PROBLEMS_FOUND
from sm120fork.maintain.report import evidence_lines, outcome_lines
from sm120fork.maintain.state import CHECK_PASSES, BumpState
from sm120fork.maintain.status import PatchStatus, ProjectStatus, status
from sm120fork.patch.series import display_name
from sm120fork.resolved import ResolvedStack
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

_VERDICT_STYLE = {"still needed": "green", "upstreamed identically": "cyan",
                  "upstreamed differently": "cyan", "conflict": "bold red"}


def _short_links(text: str) -> str:
    return re.sub(r"https://github\.com/[^/\s]+/([^/\s]+)/(?:pull|issues)/(\d+)", r"\1#\2",
                  text) or "-"


def _short_wheel(wheel: str) -> str:
    name, _, rest = wheel.partition(" ")
    try:
        version = str(parse_wheel_filename(name)[1])
    except InvalidWheelFilename:
        return wheel
    return f"{version} {rest}".strip()


def upstream_cell(forwarded: str, applied_upstream: str) -> str:
    """Forwarded and Applied-Upstream as one statement ("in 0.6.17 (flashinfer#3903)")."""
    if applied_upstream:
        where = _short_links(applied_upstream).replace(", ", " (", 1)
        return f"in {where})" if "(" in where else f"in {where}"
    if forwarded.lower() in ("", "no"):
        return "not forwarded"
    if forwarded.lower() == "not-needed":
        return "not needed"
    return f"forwarded {_short_links(forwarded)}"


_WIDE_COLUMNS = ("applies", "Forwarded", "Applied-Upstream", "Bug-Upstream",
                 "fingerprint in pin", "effect in pin", "wheel")


def _wide_cells(p: PatchStatus) -> list[str]:
    return [p.applies, p.forwarded, _short_links(p.applied_upstream),
            _short_links(p.bug_upstream), p.fingerprint_upstream, p.effect_upstream, p.wheel]


def render_evidence(projects: list[ProjectStatus], console: Console) -> None:
    records = list({e.name: e for ps in projects for e in ps.evidence}.values())
    not_current = [c for ps in projects for c in ps.claims if not c.current]
    if not records:
        return
    rows = table(f"{projects[0].stack}: evidence", ("kind", "record", "state", "verdict / why"),
                 fold=True, left=True)
    for e in sorted(records, key=lambda e: (e.kind, e.name)):
        why = "; ".join(e.reasons)
        rows.add_row(e.kind, e.name, e.state,
                     (e.verdict or "-") if e.current else
                     f"{why}; re-make: {e.command}" + (f" (needs {e.needs})" if e.needs
                                                        else "")
                     if e.command else why)
    console.print(rows)
    claimed = sum(len(ps.claims) for ps in projects)
    say(console, f"claims (Verified-By): {claimed - len(not_current)} of {claimed} current "
        "(backed by a passing record of this stack)",
        *(f"  {c.state}: {c.message()}" for c in not_current))


def render_status(projects: list[ProjectStatus], console: Console, *, wide: bool) -> None:
    """Five columns that fit 80, or every field (--wide): a record per patch where the
    console is too narrow for the table."""
    records = wide and console.width < WIDE_MIN_WIDTH
    for ps in projects:
        title = (f"{ps.stack}{' (default)' if ps.default else ''} / {ps.project} "
                 f"{ps.version} [{ps.source}]")
        if ps.bump_in_progress:
            title += f"  BUMP IN PROGRESS {ps.bump_in_progress}"
        if records:
            say(console, title)
            for p in ps.patches:
                say(console, f"  {display_name(p.patch)}", *(
                    f"    {col}: {cell or '-'}"
                    for col, cell in zip(_WIDE_COLUMNS, _wide_cells(p), strict=True)))
        else:
            table = Table(title=title, title_justify="left")
            table.add_column("patch", overflow="ellipsis", no_wrap=True,
                             max_width=None if wide else 24)
            for col in _WIDE_COLUMNS if wide else ("applies", "upstream", "in pin", "wheel"):
                table.add_column(col, overflow="fold")
            for p in ps.patches:
                name = display_name(p.patch)
                if wide:
                    table.add_row(name, *_wide_cells(p))
                else:
                    table.add_row(name, p.applies,
                                  upstream_cell(p.forwarded, p.applied_upstream),
                                  p.fingerprint_upstream if p.effect_upstream in (
                                      "-", p.fingerprint_upstream) else
                                  f"{p.fingerprint_upstream}, effect {p.effect_upstream}",
                                  _short_wheel(p.wheel))
            console.print(table)
        print_release_files(console, ps.stack, ps.undeclared_files, ps.release_files)
        for line in ps.pins_disagree:
            console.print(f"[bold red]pins disagree:[/] {line}", highlight=False,
                          soft_wrap=True)
        last_of_stack = ps is projects[-1] or projects[projects.index(ps) + 1].stack != ps.stack
        if last_of_stack:
            render_evidence([p for p in projects if p.stack == ps.stack], console)
        if ps.error:
            console.print(f"[bold red]error:[/] {ps.error}", highlight=False, soft_wrap=True)
        elif ps.not_checked:
            say(console, ps.not_checked)
        elif not ps.patches:
            console.print("(empty series)")


def run_status(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    stacks = [ws.stack(args.stack, strict=False)] if args.stack else ()
    projects = status(ws, stacks, args.wheels, fetch=not args.no_fetch)
    if args.json:
        console.print_json(json.dumps([dataclasses.asdict(p) for p in projects]))
    else:
        render_status(projects, console, wide=args.wide)
    return EXIT_PROBLEMS_FOUND if any(p.error or p.pins_disagree for p in projects) else 0


def run_bump(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.maintain.bump import BumpRequest, bump, bump_abort, bump_continue

    if args.abort:
        try:
            ab = bump_abort(ws, args.stack, args.project)
        except KeyboardInterrupt:
            if BumpState.load(ws, args.stack, args.project) is not None:
                log.warning("the abort of %s/%s stopped part-way; finish it (every file back "
                            "as it was): `%s`", args.stack, args.project,
                            command("bump", args.stack, args.project, "--abort"))
            raise
        say(console, f"aborted: {ab.stack}/{ab.project} is back at {ab.restored_version}"
            + (f"; stack {ab.stack} removed" if ab.removed_stack else "")
            + (f"; {ab.tree}" if ab.tree else ""))
        return 0
    bump_revision(args)
    try:
        if args.cont or args.skip:
            result = bump_continue(ws, args.stack, args.project, skip=args.skip)
        else:
            result = bump(ResolvedStack.named(ws, args.stack, strict=False), args.project,
                          args.revision, allow_downgrade=args.allow_downgrade,
                          new_stack=args.new_stack, version=args.pep440,
                          git_commit=args.git_commit)
    except KeyboardInterrupt:
        _say_how_to_recover(ws, args.new_stack or args.stack, args.project, BumpRequest(
            stack=args.stack, project=args.project, revision=args.revision or "",
            new_stack=args.new_stack, version=args.pep440,
            git_commit=args.git_commit).command(downgrade=args.allow_downgrade))
        raise
    table = Table(title=f"{result.stack}/{result.project}: {result.old_version} -> "
                        f"{result.new_version}", title_justify="left")
    table.add_column("patch", overflow="ellipsis", no_wrap=True, max_width=48)
    table.add_column("verdict", no_wrap=True)
    for c in result.classifications:
        style = _VERDICT_STYLE.get(c.verdict, "yellow")
        table.add_row(display_name(c.patch), f"[{style}]{c.verdict}[/]")
    console.print(table)
    # what a patch that did not apply exactly went through
    say(console, *(f"{display_name(c.patch)}: {line}" for c in result.classifications
                   for line in c.evidence if line.startswith(CHECK_PASSES)))
    r = result.refresh
    kept = len(r.added) + len(r.changed) + len(r.unchanged)
    project = ws.stack(result.stack, strict=False).project(result.project)
    say(console, *outcome_lines(project, result.old_version, result.new_version,
                                result.classifications, kept, result.used_as_published,
                                result.moves))
    print_release_files(console, result.stack, result.undeclared_files, result.release_files)
    say(console, *evidence_lines(result.stack, result.new_stack_created, result.remake),
        f"report (the evidence for each verdict): {result.report.relative_to(ws.root)}; "
        f"changelog: {result.changelog.relative_to(ws.root)}")
    waiting = BumpState.pending(ws, result.stack)
    next_step = (command("bump", result.stack, waiting[0], "--continue") if waiting else
                 command("build", "--stack", result.stack))
    say(console, f"next: {next_step}")
    return 0


def _say_how_to_recover(ws: Workspace, stack: str, project: str, again: str) -> None:
    from sm120fork.maintain.bump import finished_here

    if finished_here(ws, stack, project):
        log.warning("the bump of %s/%s had finished (every file written); it was stopped "
                    "while removing the old fork tree, a scratch folder: nothing to resume",
                    stack, project)
        return
    if BumpState.load(ws, stack, project) is None:
        log.warning("the bump stopped before it wrote anything; start it again: `%s`", again)
        return
    log.warning("the bump of %s/%s stopped part-way; resume it: `%s`, or undo it (every "
                "file back as it was): `%s`", stack, project,
                command("bump", stack, project, "--continue"),
                command("bump", stack, project, "--abort"))


def print_release_files(console: Console, stack: str, undeclared: Sequence[str],
                        summary: str) -> None:
    if undeclared:
        console.print(f"[bold yellow]release files:[/] {summary} (declare them in "
                      f"forks/{stack}.toml, or on that Python/platform pip finds no patched "
                      "build)", highlight=False, soft_wrap=True)
    elif summary:
        console.print(f"release files: {summary}", highlight=False, soft_wrap=True)


def run_watch(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.maintain.watch import summary, watch, write_report

    found = watch(ws, args.stack, limit=args.limit)
    written = [write_report(ws, sw) for sw in found]
    if args.json:
        console.print_json(json.dumps([dataclasses.asdict(sw) for sw in found]))
    else:
        for sw in found:
            for pw in sw.projects:
                say(console, f"{sw.stack}/{pw.project} {pw.pinned}: " + (
                    f"error: {pw.error}" if pw.error else f"{len(pw.newer)} newer release(s)"),
                    *(f"  {r.version}: {summary(r)}" for r in pw.releases))
    for _, md in written:
        log.info("report: %s", md.relative_to(ws.root))
    incomplete = any(pw.error or any(r.outcome == "failed" for r in pw.releases)
                     for sw in found for pw in sw.projects)
    return EXIT_PROBLEMS_FOUND if incomplete else 0


def run_refresh(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.maintain.refresh import refresh

    r = refresh(ResolvedStack.named(ws, args.stack), args.project, force=args.force)
    for label, names in (("added", r.added), ("removed", r.removed), ("changed", r.changed)):
        for n in names:
            console.print(f"{label:8} {n}")
    console.print(f"{r.stack}/{r.project}: {len(r.added)} added, {len(r.removed)} removed, "
                  f"{len(r.changed)} changed, {len(r.unchanged)} unchanged"
                  + ("" if r.wrote_anything else " (nothing written)"))
    return 0


def run_upstream_pr(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    from sm120fork.upstream.groups import find_pr, plan_of, pr_requirements, prepare, why_none

    today = ResolvedStack.named(ws, args.stack)
    if args.requirements:
        for line in pr_requirements(ws, *find_pr(today, args.project, args.pr)) \
                if args.pr and not args.no_tests else []:
            print(line)
        return 0

    if not args.pr:
        projects = [today.stack.project(args.project)] if args.project else today.stack.projects
        plans = [(project, plan_of(today, project)) for project in projects]
        for project, plan in plans:
            empty = [] if plan.prs or plan.not_proposed else ["its series is empty"]
            say(console, *(f"PR {pr.name} ({project.key}): "
                           f"{', '.join(p.name for p in pr.patches)}; " + (
                               f"tests: {', '.join(t.name for t in pr.tests)}" if pr.tests
                               else "no upstream-form test") for pr in plan.prs),
                *(f"in no PR ({project.key}): {line}" for line in [*plan.not_proposed, *empty]))
        count = sum(len(plan.prs) for _, plan in plans)
        say(console, f"{args.stack}: {count} upstream PR(s)"
            + (f"; prepare one: {command('upstream-pr', args.stack, '--pr', '<name>')}"
               if count else ""), *(f"  {why_none(today, project, plan)}"
                                    for project, plan in plans if not plan.prs))
        return 0
    done = prepare(today, args.project, args.pr, onto=args.onto, repo=args.repo,
                   out=args.out, run=not args.no_tests, write=args.write,
                   even_if_failing=args.even_if_failing)
    say(console, f"branch {done.branch}: {len(done.commits)} commit(s) on "
        + (done.onto or "the release as published"),
        *(f"  {r.said}: {r.command}: {r.summary}" for r in done.runs),
        f"wrote {os.path.relpath(done.out, ws.root)}/ "
        f"({', '.join(sorted(p.relative_to(done.out).as_posix() for p in done.files))})",
        "nothing was pushed; to submit, run in the checkout root:",
        *(f"  {line}" for line in done.commands))
    if done.record is not None:
        rec = done.record
        say(console, f"record: {rec.verdict} ({rec.counts.get('pass', 0)} pass, "
            f"{rec.counts.get('fail', 0) + rec.counts.get('error', 0)} fail, "
            f"{rec.counts.get('skip', 0)} not run here)"
            + (f"; published to {os.path.relpath(done.published, ws.root)}/"
               if done.published else
               "; not published: none of its tests ran here (they need a GPU: the offline "
               "kit's upstream_tests writes its record)"
               if args.write and all(r.outcome == "skip" for r in done.runs)
               else "; --write publishes it under reports/"))
    return EXIT_PROBLEMS_FOUND if any(r.outcome in ("fail", "error") for r in done.runs) else 0
