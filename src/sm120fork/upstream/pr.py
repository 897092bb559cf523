"""``upstream_pr``: prepare an upstream submission, never push it.

The still-needed patches (those without ``Applied-Upstream``) become one commit each on
a branch in the fork tree, on top of the pinned upstream or, with ``onto``, of a ref
fetched from an upstream checkout.  The PR title and body follow the upstream project's
template and carry the evidence the toolkit holds: the SM120 compile proof, the GPU test
results, the bench table, the environment and the wheel digests.  Everything goes under
``reports/upstream/<stack>-<project>/``; the ``git push`` and ``gh pr create`` commands
are returned for a person to run.  Missing or failing evidence is a refusal, not a
footnote.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sm120fork.declare import Project
from sm120fork.errors import CommandError, DirtyTreeError, MaintenanceError
from sm120fork.fetch.source import UPSTREAM_TAG
from sm120fork.patch.series import Patch
from sm120fork.patch.tree import keep_uncommitted_hint, open_tree
from sm120fork.standing import Today
from sm120fork.upstream.evidence import Evidence, collect_evidence, evidence_sections
from sm120fork.util.git import Git
from sm120fork.util.hint import command
from sm120fork.util.portable import machine_roles, portable_text
from sm120fork.workspace import Workspace

ONTO_REF = "refs/sm120fork/onto"
_ID_PREFIX = re.compile(r"^(?:[A-Z]\d+|\d{4})\s+")


@dataclass(frozen=True, kw_only=True)
class UpstreamPR:
    stack: str
    project: str
    reason: str
    commits: tuple[str, ...] = ()
    branch: str = ""
    tree: Path = Path()
    base: str = ""
    title: str = ""
    body: str = ""
    out_dir: Path = Path()
    files: tuple[Path, ...] = ()
    commands: tuple[str, ...] = ()
    #: Patches not in the branch, each with why (upstream already has it).
    left_out: tuple[str, ...] = ()


def short_subject(patch: Patch) -> str:
    """The subject without the fork's own patch id (``F1 ``, ``S2 ``, ``0001 ``)."""
    return _ID_PREFIX.sub("", patch.subject)


def commit_message(patch: Patch) -> str:
    """Subject plus the DEP-3 description, as written (its lines are already wrapped)."""
    body = patch.description.strip()
    trailers = [f"Bug: {patch.field('Bug-Upstream')}"] if patch.field("Bug-Upstream") else []
    parts = [short_subject(patch), body, "\n".join(trailers)]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def branch_base(git: Git, ws: Workspace, stack_name: str, project: Project, *,
                onto: str | None, repo: str | None) -> str:
    """The commit a PR's branch starts from: the pinned release (the fork tree's upstream
    tag) or, with ``onto``, that ref fetched from ``repo`` (default: the declared upstream
    repository)."""
    base = git("rev-parse", UPSTREAM_TAG, quiet=True)
    if not onto:
        return base
    source = repo or upstream_url(ws, project)
    if not source:
        raise MaintenanceError(f"{project.key} pins no upstream repository to fetch "
                               f"{onto} from", where=f"{stack_name}/{project.key}",
                               fix="pass --repo with a local upstream checkout")
    try:
        git("fetch", "--quiet", "--no-tags", source, f"+{onto}:{ONTO_REF}")
    except CommandError as exc:
        raise MaintenanceError(f"cannot fetch {onto} from {source}",
                               fix="pass --repo with a local upstream checkout",
                               detail=exc.detail) from exc
    return git("rev-parse", ONTO_REF, quiet=True)


def upstream_url(ws: Workspace, project: Project) -> str:
    """The project's upstream repository: its git pin's, else that of another stack's pin
    of the same distribution (a project taken from published wheels pins no git), else ''."""
    if project.git is not None:
        return project.git.url
    for stack in ws.stacks().values():
        for other in stack.projects:
            if other.distribution == project.distribution and other.git is not None:
                return other.git.url
    return ""


def github_slug(url: str) -> str:
    m = re.search(r"github\.com[:/]([^/]+/[^/]+?)(?:\.git)?/?$", url)
    return m.group(1) if m else ""



#: A package's own folder that upstream_pr keeps when it writes the package again: a
#: reproducer made by hand, with its script and its before/after output.
REPRODUCER = "reproducer"


def reproducer_lines(ws: Workspace, folder: Path) -> list[str]:
    """What the body says of the package's reproducer (its summary.txt), if it has one."""
    summary = folder / "summary.txt"
    if not (folder / "run.sh").is_file() or not summary.is_file():
        return []
    rel = folder.relative_to(ws.root).as_posix()
    return [f"Reproducer (CPU only, gloo ranks; `{rel}/run.sh`, its output in `{rel}/`): "
            "before is the release, after the same files plus this fix:", "", "```",
            *summary.read_text(encoding="utf-8").strip().splitlines(), "```"]


def render_body(ws: Workspace, project: Project, patches: list[Patch], ev: Evidence,
                onto: str | None, reproducer: list[str] | None = None) -> str:
    sec = evidence_sections(ws, ev)
    repro = [*(reproducer or []), ""] if reproducer else []
    changes: list[str] = []
    for p in patches:
        changes += [f"### {short_subject(p)}", "", p.description.strip(), "",
                    "Files: " + ", ".join(f"`{f}`" for f in p.files), ""]
    mods = [f"- {short_subject(p)} ({', '.join(f'`{f}`' for f in p.files)})" for p in patches]
    bugs = sorted({p.field("Bug-Upstream") for p in patches if p.field("Bug-Upstream")})
    based = (f"Based on `{onto}`." if onto else
             f"Based on the {project.distribution} {project.version} release.")
    name = project.normalized_name
    if name == "sglang":  # .github/pull_request_template.md of sgl-project/sglang
        lines = ["## Motivation", "", based, "", *changes,
                 "## Modifications", "", *mods, "",
                 "## Accuracy Tests", "", *repro, *sec["tests"], "", *sec["proof"], "",
                 "## Benchmarking and Profiling", "", *sec["bench"], "",
                 "### Environment", "", *sec["env"], "", *sec["wheels"], "",
                 "## Checklist", "",
                 "- [x] Format your code according to the code style.",
                 "- [x] Add unit tests / accuracy evidence (above).",
                 "- [ ] Update documentation as needed.",
                 "- [x] Provide throughput / latency benchmark results (above)."]
    elif name.startswith("flashinfer"):  # flashinfer-ai/flashinfer's PR template
        lines = ["## 📌 Description", "", based, "", *changes,
                 "## 🔍 Related Issues", "", *([f"- {b}" for b in bugs] or ["-"]), "",
                 "## 🚀 Pull Request Checklist", "",
                 "### ✅ Pre-commit Checks", "",
                 "- [ ] I have installed `pre-commit` and run `pre-commit run --all-files`.",
                 "", "## 🧪 Tests", "",
                 "- [x] Tests have been run (evidence below).", "",
                 *repro, *sec["tests"], "", *sec["proof"], "",
                 "### Benchmark", "", *sec["bench"], "",
                 "## Reviewer Notes", "", *sec["env"], "", *sec["wheels"]]
    else:
        lines = ["## Description", "", based, "", *changes, "## Changes", "", *mods, "",
                 "## Tests", "", *repro, *sec["tests"], "", *sec["proof"], "",
                 "## Benchmarks", "", *sec["bench"], "", "## Environment", "", *sec["env"],
                 "", *sec["wheels"]]
    return "\n".join(lines).rstrip() + "\n"


def _title(project: Project, patches: list[Patch]) -> str:
    if len(patches) == 1:
        return short_subject(patches[0])
    areas = list(dict.fromkeys(short_subject(p).split(":", 1)[0] for p in patches))
    return f"SM120/SM121 support: {len(patches)} fixes ({', '.join(areas)})"


def _build_branch(repo: Git, base: str, patches: list[Patch], onto: str | None
                  ) -> list[str]:
    """One commit per patch on ``base``, made on a scratch index: the work tree is untouched."""
    fd, index = tempfile.mkstemp(prefix="sm120fork-pr-index.")
    os.close(fd)
    env = {"GIT_INDEX_FILE": index}
    parent = base
    commits: list[str] = []
    try:
        for p in patches:
            repo("read-tree", parent, env=env, quiet=True)
            try:
                repo("apply", "--cached", str(p.path), env=env, quiet=True)
            except CommandError as exc:
                raise MaintenanceError(
                    f"patch {p.name} does not apply onto {onto or base}",
                    fix="bump the project to that upstream first, then prepare the PR",
                    detail=exc.detail) from exc
            tree = repo("write-tree", env=env, quiet=True)
            name, email = p.author
            date = f"{p.field('Last-Update')}T00:00:00+00:00"
            parent = repo("commit-tree", tree, "-p", parent, "-m", commit_message(p).rstrip(),
                          env={**env, "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
                               "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
                               "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
            commits.append(parent)
    finally:
        os.unlink(index)
    return commits


def output_dir(ws: Workspace, stack: str, project: str, *, write: bool) -> Path:
    """reports/upstream/<stack>-<project> (tracked) with ``write``, else under .forks/."""
    top = ws.reports_dir if write else ws.state_dir
    return top / "upstream" / f"{stack}-{project}"


def upstream_pr(ws: Workspace, stack_name: str, project_key: str, *, onto: str | None = None,
                repo: str | None = None, wheels_dir: Path | None = None,
                write: bool = False) -> UpstreamPR:
    """Prepare the PR.  Its files go to reports/upstream/ (tracked) only with ``write``."""
    stack = ws.stack(stack_name)
    project = stack.project(project_key)
    # The stack resolved once (every series, the build's manifest): the checks, the
    # evidence and the branch below all read this, none reads a series again by name.
    today = Today.of(ws, stack, wheels_dir=wheels_dir)
    series = today.series[project.key]
    wanted = [p for p in series.patches if not p.applied_upstream]
    left_out = tuple(f"{p.name}: Applied-Upstream {p.applied_upstream} (upstream has it)"
                     for p in series.patches if p.applied_upstream)
    if not wanted:
        why = ("the series is empty" if not series.patches else
               "every patch names an Applied-Upstream release")
        return UpstreamPR(stack=stack.name, project=project.key, reason=why,
                          left_out=left_out)
    with ws.lock():
        tree = open_tree(ws, stack, project)
        work, state, git = tree.path, tree.state, tree.repo
        again = command("upstream-pr", stack.name, project.key)
        refresh = command("refresh", stack.name, project.key)
        if git.am_in_progress():
            w = shlex.quote(str(work))
            raise DirtyTreeError("a git am is in progress in the fork tree", where=str(work),
                                 fix=f"finish it (`git -C {w} am --continue`) or drop it "
                                     f"(`git -C {w} am --abort`), then `{again}`")
        if git.is_dirty():
            raise DirtyTreeError("the fork tree has uncommitted changes", where=str(work),
                                 fix=keep_uncommitted_hint(work, then=f"`{refresh}` and "
                                                                      f"`{again}`"))
        if git.head() != state.head:
            raise MaintenanceError("the fork tree has commits the series does not hold",
                                   where=str(work), fix=f"export them: `{refresh}`, then "
                                                        f"build and `{again}`")
        if not state.complete or state.series != series.digest:
            raise MaintenanceError("the fork tree does not hold the current series",
                                   where=str(work),
                                   fix=f"`{command('build', '--stack', stack.name)}`, "
                                       f"then `{again}`")
        evidence = collect_evidence(ws, today, project, patches=[p.name for p in wanted])
        base = branch_base(git, ws, stack.name, project, onto=onto, repo=repo)
        commits = _build_branch(git, base, wanted, onto)
        branch = f"sm12x/{project.key}-{project.version}" + ("-onto" if onto else "")
        git("update-ref", f"refs/heads/{branch}", commits[-1])
        title = _title(project, wanted)
        out = output_dir(ws, stack.name, project.key, write=write)
        kept = output_dir(ws, stack.name, project.key, write=True) / REPRODUCER
        body = render_body(ws, project, wanted, evidence, onto, reproducer_lines(ws, kept))
        if out.exists():
            for child in out.iterdir():
                if child.name == REPRODUCER:
                    continue
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        (out / "patches").mkdir(parents=True)
        git("format-patch", "--quiet", "--zero-commit", "--no-signature", "-o",
            str(out / "patches"), f"{base}..{commits[-1]}")
        slug = github_slug(upstream_url(ws, project)) or "<owner>/<repo>"
        # Relative to the project root: the files travel, no machine path in them.
        commands = [
            "# from the project root",
            f"git -C {shlex.quote(os.path.relpath(work, ws.root))} push <your-fork-url> "
            f"{branch}:{branch}",
            f"gh pr create --repo {slug} --base main --head <your-github-user>:{branch} "
            f"--title {shlex.quote(title)} --body-file "
            f"{shlex.quote(str((out / 'body.md').relative_to(ws.root)))}",
        ]
        if not onto:
            commands.insert(1, f"# the branch sits on the {project.distribution} "
                               f"{project.version} source import, not upstream's history: "
                               "rebase with --onto <upstream ref> --repo <upstream checkout> "
                               "before pushing")
        roles = machine_roles(ws.root)
        body = portable_text(body, roles)
        (out / "title.txt").write_text(title + "\n", encoding="utf-8")
        (out / "body.md").write_text(body, encoding="utf-8")
        (out / "PR.md").write_text(f"# {title}\n\n{body}", encoding="utf-8")
        (out / "commands.sh").write_text("#!/bin/sh\n# Not run by the toolkit.\n"
                                         + "\n".join(commands) + "\n", encoding="utf-8")
        (out / "evidence.json").write_text(json.dumps({
            "stack": stack.name, "project": project.key, "branch": branch,
            "base": base, "onto": onto, "commits": commits,
            "patches": [{"name": p.name, "sha256": p.sha256} for p in wanted],
            "evidence_files": evidence.files,
            "left_out": list(left_out),
        }, indent=1) + "\n", encoding="utf-8")
        files = tuple(sorted(p for p in out.rglob("*")
                             if p.is_file() and REPRODUCER not in p.relative_to(out).parts))
        return UpstreamPR(stack=stack.name, project=project.key, reason="", commits=tuple(
            f"{c[:12]} {short_subject(p)}" for c, p in zip(commits, wanted, strict=True)),
            branch=branch, tree=work, base=base, title=title, body=body, out_dir=out,
            files=files, commands=tuple(commands), left_out=left_out)
