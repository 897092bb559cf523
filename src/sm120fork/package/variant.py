"""Test-only variants of a patched project: its series plus the test patches of
``<series dir>-test/`` (e.g. F5's forced cluster size), built in a fork tree of their own
into ``.forks/test-variants/<stack>/<name>/`` as ``<label>.<name>``, never published."""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
from pathlib import Path

from sm120fork.errors import ConfigError
from sm120fork.package.wheel import build_wheel
from sm120fork.patch.series import load_series
from sm120fork.patch.tree import prepare_tree
from sm120fork.resolved import ResolvedStack

log = logging.getLogger("sm120fork")
_NAME = re.compile(r"^[a-z0-9]+$")


def build_test_variant(today: ResolvedStack, *, project_key: str = "flashinfer",
                       name: str = "test", force: bool = False) -> Path:
    """Build ``project_key`` with its series and its test series; return the wheel."""
    if not _NAME.match(name):
        raise ConfigError(f"bad test variant name {name!r}", fix="lower-case letters and digits")
    ws, stack, project = today.ws, today.stack, today.stack.project(project_key)
    real = today.series[project_key].patches
    series_dir = ws.series_dir(project)
    tests = load_series(series_dir.with_name(series_dir.name + "-test")).patches
    tree = prepare_tree(ws, stack, project, patches=[*real, *tests], variant=name, force=force)
    variant = dataclasses.replace(project, local_label=f"{project.local_label}.{name}")
    out = ws.state_dir / "test-variants" / stack.name / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log.info("building test variant %s of %s (%d + %d patches)", name, project_key, len(real),
             len(tests))
    return build_wheel(variant, tree.repo, out,
                       changed_files=[f for p in [*real, *tests] for f in p.files])
