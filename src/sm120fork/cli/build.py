"""``build``, ``index`` and ``build-test-variant``: wheels made, rendered."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from sm120fork.cli.output import say, table
from sm120fork.declare import Stack
from sm120fork.errors import UsageError
from sm120fork.index import stack_routes, write_index
from sm120fork.package.kinds import Options
from sm120fork.package.publish import ProjectBuild, folder_routes, shown
from sm120fork.package.stack import build_stack
from sm120fork.plugin.build import PLUGIN_DIR, PublishedPlugin
from sm120fork.workspace import Workspace


def _download_progress(console: Console) -> Callable[[str], Callable[[int, int | None], None]]:
    def factory(label: str) -> Callable[[int, int | None], None]:
        bar = Progress(TextColumn(f"downloading {label}"), BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), console=console, transient=True)
        task = bar.add_task(label, total=None)

        def update(done: int, total: int | None) -> None:
            if not bar.live.is_started:  # shown once the download started
                bar.start()
            bar.update(task, completed=done, total=total)
            if total is not None and done >= total:
                bar.stop()
        return update
    return factory


class StageLine:
    """One live line per project while it builds ("flashinfer: building: copying ..."),
    so a 2-minute wheel build is not silent; gone when the build ends (transient)."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.tasks: dict[str, TaskID] = {}
        self.lock = threading.Lock()

    def __call__(self, project: str, what: str) -> None:
        text = f"{project}: {what}"
        width = max(20, self.progress.console.width - 16)
        text = text if len(text) <= width else text[:width - 1] + "…"
        with self.lock:
            if not self.tasks:  # started with the first stage: after the download bars
                self.progress.start()
            if project not in self.tasks:
                self.tasks[project] = self.progress.add_task(text, total=None)
            self.progress.update(self.tasks[project], description=text)

    def __enter__(self) -> StageLine:
        return self

    def __exit__(self, *_: object) -> None:
        if self.tasks:
            self.progress.stop()


def summary_table(stack: Stack, out: Path, builds: list[ProjectBuild]) -> Table:
    """One row per published wheel: each project's, and the plugin wheel the build
    generated beside them (``plugin/``, stacks whose SGLang has the plugin framework)."""
    rows = table(f"stack {stack.name} -> {out}",
                 ("project", "upstream", "patches", "wheel", "sha256", "build"), fold=True)
    for b in builds:
        how = "cached" if b.cached else f"{b.seconds:.1f}s"
        if b.entry.used_as_published:
            how = f"used as published ({how})"
        rows.add_row(b.project, b.upstream_version, str(len(b.entry.patches)), b.wheel.name,
                     b.sha256[:12], how)
    plugin = PublishedPlugin.read(out)
    if plugin is not None:
        rows.add_row("plugin", f"sglang {plugin.sglang}", f"{plugin.hooks} hooks",
                     f"{PLUGIN_DIR}/{plugin.wheel}", plugin.sha256[:12],
                     "generated from the series")
    return rows


def run(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    if args.all_stacks and args.out:
        raise UsageError("--out takes one stack; --all-stacks publishes each into "
                         "wheels/<stack>/", where="python -m sm120fork build",
                         fix="drop --out, or name one --stack")
    stacks = ([s.check_pins() for s in ws.stacks().values()] if args.all_stacks
              else [ws.stack(args.stack)])
    for stack in stacks:
        start = time.monotonic()
        with StageLine(console) as stage:
            options = Options(force=args.force, rebuild=args.rebuild, out=args.out,
                              progress=_download_progress(console), stage=stage,
                              unchecked=args.unchecked)
            builds = build_stack(ws, stack, options, lock_timeout=args.lock_timeout)
        out = args.out or ws.stack_wheels(stack.name)
        console.print(summary_table(stack, out, builds))
        first, *others = folder_routes(shown(ws, out), [b.entry for b in builds],
                                       PublishedPlugin.read(out))
        say(console, f"done in {time.monotonic() - start:.2f}s; install with: {first.line}",
            *(f"or, {route.name}: {route.line}" for route in others))
    return 0


def run_index(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    index = write_index(ws, url=args.url, out=args.out)
    say(console, *index.notes, *(f"{s.stack.name}, {route.name}: {route.line}"
                                 for s in index.stacks for route in stack_routes(index.url, s)))
    console.print(f"wrote {index.files} wheel(s) of {len(index.stacks)} stack(s) into "
                  f"{shown(ws, index.out)}/ (landing page: index.html)", markup=False)
    return 0


def run_test_variant(args: argparse.Namespace, ws: Workspace, console: Console) -> int:
    """A project's series plus its test series, built, never published."""
    from sm120fork.package.wheel import build_test_variant
    from sm120fork.resolved import ResolvedStack

    wheel = build_test_variant(ResolvedStack.named(ws, args.stack), project_key=args.project,
                               name=args.name, force=args.force)
    console.print(f"test variant: {wheel.relative_to(ws.root)}")
    return 0
