"""Where things live: declarations, series, caches, work trees and shipped wheels."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock

from sm120fork.declare import Project, Stack, load_stacks, select_stack
from sm120fork.errors import ConfigError, LockError

log = logging.getLogger("sm120fork")


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def find(cls, start: Path | None = None) -> Workspace:
        """The nearest directory at or above ``start`` that has ``forks/``."""
        env = os.environ.get("SM120FORK_ROOT")
        here = Path(env) if env else (start or Path.cwd())
        for candidate in (here, *here.resolve().parents):
            if (candidate / "forks").is_dir():
                return cls(candidate.resolve())
        raise ConfigError("no forks/ directory here or above", where=str(here),
                          fix="run from the toolkit checkout or set SM120FORK_ROOT")

    @property
    def forks_dir(self) -> Path:
        return self.root / "forks"

    @property
    def state_dir(self) -> Path:
        return self.root / ".forks"

    @property
    def sdist_cache(self) -> Path:
        return self.state_dir / "cache" / "sdists"

    @property
    def wheel_cache(self) -> Path:
        """Downloaded upstream wheels (the ``wheel`` source kind, projects used as published)."""
        return self.state_dir / "cache" / "wheels"

    @property
    def wheels_dir(self) -> Path:
        """Where every stack publishes, each into its own folder (``stack_wheels``)."""
        return self.root / "wheels"

    def stack_wheels(self, stack_name: str) -> Path:
        """``wheels/<stack>/``: one stack's wheels, constraints.txt and manifest.json."""
        return self.wheels_dir / stack_name

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    @property
    def trees_dir(self) -> Path:
        """``.forks/trees/``: the fork work trees, ``<stack>/<project>[@variant]``."""
        return self.state_dir / "trees"

    def work_tree(self, stack: Stack, project: Project, variant: str = "") -> Path:
        name = project.key if not variant else f"{project.key}@{variant}"
        return self.trees_dir / stack.name / name

    def build_cache(self, stack: Stack, project: Project) -> Path:
        return self.state_dir / "builds" / stack.name / project.key

    def series_dir(self, project: Project) -> Path:
        return self.root / project.series

    def stacks(self) -> dict[str, Stack]:
        """Every stack, also one whose pins disagree (``Stack.pin_problems`` says where)."""
        return load_stacks(self.forks_dir)

    def stack(self, name: str | None = None, *, strict: bool = True) -> Stack:
        """One stack; ``strict`` (the default) refuses it when its pins disagree."""
        return select_stack(self.stacks(), name, strict=strict)

    @contextlib.contextmanager
    def lock(self, timeout: float = -1) -> Iterator[None]:
        """Hold the workspace lock; a second run waits (or fails after ``timeout`` s)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.state_dir / "lock"))
        pid_file = self.state_dir / "lock.pid"
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            holder = pid_file.read_text().strip() if pid_file.exists() else "unknown"
            if timeout == 0:
                raise LockError(f"another toolkit run (pid {holder}) holds the lock",
                                where=str(self.state_dir / "lock"),
                                fix="wait for it to finish") from None
            log.warning("waiting for another toolkit run (pid %s) to finish...", holder)
            try:
                lock.acquire(timeout=timeout)
            except filelock.Timeout:
                raise LockError(f"another toolkit run (pid {holder}) still holds the lock "
                                f"after {timeout:.0f}s", where=str(self.state_dir / "lock"),
                                fix="wait for it to finish, or pass a longer --lock-timeout"
                                ) from None
        try:
            pid_file.write_text(str(os.getpid()))
            yield
        finally:
            pid_file.unlink(missing_ok=True)
            lock.release()
