"""Every stack's upstream PRs, prepared on its pinned upstream tree (issue 32's "done when"):
``upstream_pr`` lists them, each PR's patches and tests apply there, and nothing in the
prepared package names the fork, a stack, a patch id or a path of this machine (the
package is grepped here, independently of upstream_pr's own refusal)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sm120fork.patch.series import load_series
from sm120fork.patch.tree import prepare_tree
from sm120fork.resolved import ResolvedStack
from sm120fork.upstream.groups import plan_of, prepare
from sm120fork.workspace import Workspace

from helpers_ws import checkout_copy

pytestmark = [pytest.mark.network, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
STACKS = sorted(p.stem for p in (REPO / "forks").glob("*.toml"))
#: What an upstream package must never say (besides each stack's name and patch ids).
FORK = re.compile(r"(?i)sm120fork|sm12x-fork|\.config/sm120|noreply\.invalid")


@pytest.fixture
def identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))


@pytest.mark.parametrize("stack_name", STACKS)
def test_each_pr_of_the_stack_applies_upstream_and_speaks_upstreams_language(
        tmp_path: Path, stack_name: str, identity: None) -> None:
    ws = Workspace(checkout_copy(tmp_path))
    stack = ws.stack(stack_name)
    ids = {patch.subject.split()[0] for other in ws.stacks().values()
           for proj in other.projects for patch in load_series(ws.series_dir(proj)).patches}
    ours = re.compile("|".join([FORK.pattern, *(rf"(?<![\w-]){re.escape(s)}(?![\w-])"
                                                for s in ws.stacks())]
                               + [rf"\b{re.escape(i)}\b" for i in ids
                                  if re.fullmatch(r"[A-Z]+\d+", i)]))
    today = ResolvedStack.of(ws, stack)
    for project in stack.projects:
        plan = plan_of(today, project)
        if not plan.prs:
            continue
        prepare_tree(ws, stack, project, patches=today.series[project.key].patches)
        for pr in plan.prs:
            done = prepare(today, project.key, pr.name, run=False,
                           out=tmp_path / "out" / pr.name)
            assert len(done.commits) == len(pr.patches) + len(pr.tests)
            for path in done.files:
                text = path.read_text(encoding="utf-8")
                assert not ours.search(text), (path, ours.search(text))
                assert str(REPO) not in text, path
                assert str(tmp_path) not in text, path
                assert str(Path.home()) + "/" not in text, path
