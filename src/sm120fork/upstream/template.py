"""A PR body in the upstream project's own template (SGLang's, FlashInfer's), every box
ticked only on evidence: the runs of the PR's own tests."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sm120fork.patch.series import Patch

_ID_PREFIX = re.compile(r"^(?:[A-Z]\d+|\d{4})\s+")


def short_subject(patch: Patch) -> str:
    """The subject without the fork's own patch id (``F1 ``, ``S2 ``, ``0001 ``)."""
    return _ID_PREFIX.sub("", patch.subject)


def needs_gpu(test_file: str) -> bool:
    """SGLang's unit tests (``test/``) run on a CPU; FlashInfer's (``tests/``) need a GPU."""
    return not test_file.startswith("test/")


@dataclass(frozen=True, kw_only=True)
class TestRun:
    """One test file of the PR on the patched upstream tree; ``outcome`` as a record's
    (error: it could not run; skip: not run here)."""

    path: str
    outcome: str
    summary: str
    where: str = "on a CPU"

    @property
    def command(self) -> str:
        """How upstream runs the file: SGLang's as a script, FlashInfer's under pytest."""
        rel = self.path
        return f"python -m pytest {rel} -v" if needs_gpu(rel) else f"python3 {rel}"

    @property
    def ran(self) -> bool:
        return self.outcome in ("pass", "fail")

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def said(self) -> str:
        return "ran" if self.ran else "could not run" if self.outcome == "error" else "not run"


def _box(done: bool, text: str) -> str:
    return f"- [{'x' if done else ' '}] {text}"


def related(patches: list[Patch]) -> list[str]:
    """``Related: owner/repo#N`` for each upstream issue or PR the patches name."""
    return list(dict.fromkeys(
        f"Related: {repo}#{number}" for p in patches for repo, number in re.findall(
            r"https://github\.com/([^/\s]+/[^/\s]+)/(?:issues|pull)/(\d+)",
            " ".join((p.field("Bug-Upstream"), p.field("Bug"))))))


def _tested(runs: list[TestRun]) -> list[str]:
    return [f"- `{r.command}`: {r.summary}" if r.outcome == "skip" else
            f"- `{r.command}` on the patched tree, {r.where}: "
            f"{'' if r.ran else 'could not run: '}{r.summary}"
            for r in runs] or ["No test of its own comes with this PR."]


def render_body(project: str, *, patches: list[Patch], tests: list[Patch],
                runs: list[TestRun], onto: str | None, release: str) -> str:
    what = [line for p in patches
            for line in (f"**{short_subject(p)}**", "", p.description.strip(), "")]
    refs = related(patches)
    based = (f"Based on `{onto}`." if onto else
             f"Made on the {release} release"
             + (" and tested there" if any(r.ran for r in runs) else "")
             + "; it applies there as is.")
    added = bool(tests)
    all_ran = bool(runs) and all(r.ran for r in runs)
    passing = bool(runs) and all(r.passed for r in runs)
    tested = ["### Tests", "", *_tested(runs)]
    if project == "sglang":
        lines = ["## Motivation", "", *what, *refs, *([""] if refs else []),
                 "## Modifications", "",
                 *[f"- {short_subject(p)} ({', '.join(f'`{f}`' for f in p.files)})"
                   for p in [*patches, *tests]], "", based, "", *tested, "",
                 "## Benchmark & Profiling", "",
                 "No benchmark with this PR.", "",
                 "## Checklist", "",
                 _box(False, "Format your code according to the [Code Formatting with "
                      "Pre-Commit](https://docs.sglang.ai/references/contribution_guide.html"
                      "#code-formatting-with-pre-commit)."),
                 _box(added and passing, "Add unit tests as outlined in the [Running Unit "
                      "Tests](https://docs.sglang.ai/references/contribution_guide.html"
                      "#running-unit-tests-adding-to-ci)."),
                 _box(False, "Update documentation / docstrings / example tutorials as "
                      "needed, according to [Writing Documentation](https://docs.sglang.ai/"
                      "references/contribution_guide.html#writing-documentation-running-docs-ci)."),
                 _box(False, "Provide throughput / latency benchmark results and accuracy "
                      "evaluation results as needed, according to [Benchmark and Profiling]"
                      "(https://docs.sglang.ai/references/benchmark_and_profiling.html) and "
                      "[Accuracy Results](https://docs.sglang.ai/references/"
                      "accuracy_evaluation.html)."),
                 _box(False, "For reviewers: If you haven't made any contributions to this PR "
                      "and are only assisting with merging the main branch, please remove "
                      "yourself as a co-author when merging the PR."),
                 _box(False, "Please feel free to join our Slack channel at "
                      "https://slack.sglang.ai to discuss your PR.")]
    elif project.startswith("flashinfer"):
        lines = ["## 📌 Description", "", *what, based, "",
                 "## 🔍 Related Issues", "", *(refs or ["None found."]), "",
                 "## 🚀 Pull Request Checklist", "",
                 "Thank you for contributing to FlashInfer! Before we review your pull "
                 "request, please make sure the following items are complete.", "",
                 "### ✅ Pre-commit Checks", "",
                 _box(False, "I have installed `pre-commit` by running `pip install "
                      "pre-commit` (or used your preferred method)."),
                 _box(False, "I have installed the hooks with `pre-commit install`."),
                 _box(False, "I have run the hooks manually with `pre-commit run --all-files` "
                      "and fixed any reported issues."), "",
                 "## 🧪 Tests", "",
                 _box(added, "Tests have been added or updated as needed."),
                 _box(all_ran and passing, "All tests are passing (`unittest`, etc.)."), "",
                 *tested, "",
                 "## 🔬 Experimental Track", "",
                 _box(False, "This PR is **experimental**: it adds or changes code under "
                      "`flashinfer/experimental/` and/or an `@flashinfer_experimental_api`. "
                      "Tracking issue: #"), "",
                 "## Reviewer Notes", "", "-"]
    else:
        lines = ["## Description", "", *what, *refs, "", based, "", *tested]
    return "\n".join(lines).rstrip() + "\n"
