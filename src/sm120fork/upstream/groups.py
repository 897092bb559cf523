"""One upstream PR per ``Upstream-PR`` group of a series (``Forwarded: no``), with its
upstream-form tests (``upstream-tests/``): :func:`plan` lists them, :func:`prepare` makes
one (branch, test runs, a package that names no fork, stack, patch id or local path)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import sys
import tempfile
import tomllib
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from sm120fork import __version__, record
from sm120fork.declare import Project, Stack
from sm120fork.errors import CommandError, ConfigError, MaintenanceError
from sm120fork.fetch.kinds import UPSTREAM_TAG
from sm120fork.patch.series import Patch
from sm120fork.patch.tree import open_tree
from sm120fork.resolved import ResolvedStack
from sm120fork.upstream.template import TestRun, needs_gpu, render_body, short_subject
from sm120fork.util import proc
from sm120fork.util.files import staged_dir
from sm120fork.util.git import Git
from sm120fork.util.hint import command, via_nox
from sm120fork.workspace import Workspace

FORK_NAMES = ("sm120fork", "sm12x-fork")
_MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|work|home|root|opt|Users|var/folders)/")

ONTO_REF = "refs/sm120fork/onto"


def branch_base(git: Git, ws: Workspace, stack_name: str, project: Project, *,
                onto: str | None, repo: str | None) -> str:
    """The commit a PR's branch starts from: the pinned release, or ``onto`` fetched from
    ``repo`` (default: the upstream repository)."""
    base = git("rev-parse", UPSTREAM_TAG)
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
    return git("rev-parse", ONTO_REF)


def upstream_url(ws: Workspace, project: Project) -> str:
    """The project's upstream repository: its git pin's, else another stack's of the same
    distribution, else ''."""
    if project.git is not None:
        return project.git.url
    return next((other.git.url for stack in ws.stacks().values() for other in stack.projects
                 if other.distribution == project.distribution and other.git is not None), "")


def github_slug(url: str) -> str:
    m = re.search(r"github\.com[:/]([^/]+/[^/]+?)(?:\.git)?/?$", url)
    return m.group(1) if m else ""


@dataclass(frozen=True, kw_only=True)
class PlannedPR:
    name: str
    patches: tuple[Patch, ...]
    tests: tuple[Patch, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Plan:
    prs: tuple[PlannedPR, ...]
    not_proposed: tuple[str, ...] = ()


def _why_not(p: Patch) -> str:
    forwarded = p.field("Forwarded").strip()
    if p.applied_upstream:
        return f"upstream has it (Applied-Upstream {p.applied_upstream})"
    if forwarded == "not-needed":
        return "fork only (Forwarded: not-needed)"
    if forwarded not in ("", "no"):
        return f"sent already ({forwarded})"
    return "not grouped for upstream (Forwarded: no, and no Upstream-PR header)"


def plan_of(today: ResolvedStack, project: Project) -> Plan:
    """The PRs of a project's series, in the order their first patch appears."""
    groups: dict[str, list[Patch]] = {}
    not_proposed: list[str] = []
    tests = today.upstream_tests.get(project.key)
    for p in today.series[project.key].patches:
        name = p.field("Upstream-PR").strip()
        if name and not p.applied_upstream and p.field("Forwarded").strip() == "no":
            groups.setdefault(name, []).append(p)
        else:
            not_proposed.append(f"{p.name}: {_why_not(p)}")
    found: dict[str, list[Patch]] = {}
    for t in tests.patches if tests else ():
        name = t.field("Upstream-PR").strip()
        if name not in groups:
            raise MaintenanceError(f"upstream test {t.name} names PR {name!r}, which no patch "
                                   "of the series belongs to", where=str(t.path),
                                   fix="set its Upstream-PR to one of: " + ", ".join(groups))
        found.setdefault(name, []).append(t)
    return Plan(not_proposed=tuple(not_proposed), prs=tuple(
        PlannedPR(name=n, patches=tuple(ps), tests=tuple(found.get(n, ())))
        for n, ps in groups.items()))


def why_none(today: ResolvedStack, project: Project, plan: Plan) -> str:
    """Why ``project`` has no PR: how many patches go in none, per reason (``3 fork only,
    ...``), and the other stacks with PRs for a newer release of it."""
    whys = (line.split(": ", 1)[1] for line in plan.not_proposed)
    counts = Counter(w if w.startswith("not grouped") else w.split(" (", 1)[0] for w in whys)
    said = ", ".join(f"{n} {why}" for why, n in counts.items()) or "its series is empty"
    elsewhere, ws = [], today.ws
    for other in ws.stacks().values():
        for theirs in other.projects if other.name != today.name else ():
            try:
                newer = (theirs.distribution == project.distribution
                         and Version(theirs.version) > Version(project.version))
            except InvalidVersion:
                continue
            if newer and plan_of(ResolvedStack.of(ws, other), theirs).prs:
                elsewhere.append(other.name)
    if elsewhere:
        said += (f"; its upstream PRs are made from stack {', '.join(elsewhere)} (a newer "
                 f"{project.distribution}): `{command('upstream-pr', elsewhere[0])}`")
    return f"no PR from {project.key}: {said}"


def fork_words(today: ResolvedStack) -> list[str]:
    """What an upstream package must not name: the fork, every stack, every patch id."""
    ws = today.ws
    words = [*FORK_NAMES, *ws.stacks()]
    for other in ws.stacks().values():
        resolved = today if other.name == today.name else ResolvedStack.of(ws, other)
        for proj in other.projects:
            words += [m.group(1) for p in resolved.series[proj.key].patches
                      if (m := re.match(r"([A-Z]+\d+)(?!\S)", p.subject))]
    return sorted(set(words))


def leaks(folder: Path, words: list[str], *, paths: list[str]) -> list[str]:
    """``file:line: what`` for every fork word or machine path in the files of ``folder``."""
    found: list[str] = []
    pattern = re.compile(r"(?i)(?<![\w-])(" + "|".join(map(re.escape, words)) + r")(?![\w-])")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            hits = [m.group(1) for m in pattern.finditer(line)]
            hits += [p for p in paths if p and p in line]
            if _MACHINE_PATH.search(line):
                hits.append("a machine path")
            hits += [f"name {rel!r}" for w in words if w.lower() in rel.lower()][:1]
            if hits:
                found.append(f"{rel}:{n}: {', '.join(dict.fromkeys(hits))}")
    return found


def git_identity(where: Path) -> tuple[str, str]:
    """(name, email) of the user's git configuration in their checkout ``where``."""
    values = [proc.run(["git", "config", "--get", key], cwd=where, check=False,
                       quiet=True).stdout.strip() for key in ("user.name", "user.email")]
    if not all(values):
        raise MaintenanceError(
            "an upstream PR is authored by you, and git knows no user.name / user.email",
            fix='git config --global user.name "Your Name" && '
                'git config --global user.email you@example.com')
    return values[0], values[1]


@dataclass(frozen=True, kw_only=True)
class Prepared:
    branch: str
    base: str
    onto: str | None
    out: Path
    commits: tuple[str, ...]
    runs: tuple[TestRun, ...]
    commands: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()
    record: record.Record | None = None
    published: Path | None = None


def _commit_all(repo: Git, base: str, patches: list[Patch], who: tuple[str, str],
                where: str) -> list[str]:
    parent, commits = base, []
    with tempfile.TemporaryDirectory(prefix="upstream-pr-index.") as tmp:
        env = {"GIT_INDEX_FILE": f"{tmp}/index"}
        for p in patches:
            repo("read-tree", parent, env=env)
            try:
                repo("apply", "--cached", str(p.path), env=env)
            except CommandError as exc:
                raise MaintenanceError(f"patch {p.name} does not apply onto {where}",
                                       fix="bump the project to that upstream first",
                                       detail=exc.detail) from exc
            tree = repo("write-tree", env=env)
            date = f"{p.field('Last-Update')}T00:00:00+00:00"
            message = "\n\n".join(x for x in (short_subject(p), p.description.strip()) if x)
            parent = repo("commit-tree", tree, "-p", parent, "-m", message,
                          env={**env, "GIT_AUTHOR_NAME": who[0], "GIT_AUTHOR_EMAIL": who[1],
                               "GIT_COMMITTER_NAME": who[0], "GIT_COMMITTER_EMAIL": who[1],
                               "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
            commits.append(parent)
    return commits


def _added_tests(patches: tuple[Patch, ...]) -> list[str]:
    return [f for t in patches for f in t.files
            if re.search(r"(^|/)tests?/", f) and Path(f).name.startswith("test_")
            and f.endswith(".py")]


PR_FILE = "pr.json"
#: Makes each PR's folder pytest's root: no configuration around the kit applies.
PYTEST_INI = "[pytest]\n"


def write_gpu_tests(today: ResolvedStack, dest: Path, names: tuple[str, ...] = ()) -> list[str]:
    """The GPU tests of the stack's PRs (``names``, default all) as the offline kit carries
    them: ``dest/<pr>/`` with the files its tests add and ``pr.json`` (the patches a run
    tests: the PR's, then the rest of the stack's build).  Returns the PRs written."""
    stack = today.stack
    written: list[str] = []
    for project in stack.projects:
        for pr in plan_of(today, project).prs:
            files = [f for f in _added_tests(pr.tests) if needs_gpu(f)]
            if not files or (names and pr.name not in names):
                continue
            folder = dest / pr.name
            folder.mkdir(parents=True)
            for t in pr.tests:  # new files only: applied in an empty folder, no repository
                proc.run(["git", "apply", str(t.path)], cwd=folder, quiet=True,
                         env={"GIT_CEILING_DIRECTORIES": str(folder.parent)})
            (folder / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
            rest = [p for p in today.series[project.key].patches
                    if p.name not in {q.name for q in pr.patches}]
            data = {
                "pr": pr.name, "stack": stack.name, "project": project.key,
                "files": files,
                "patches": [{"project": project.key, "patch": p.name, "patch_id": p.patch_id}
                            for p in [*pr.patches, *pr.tests, *rest]],
                "notes": [f"the patched wheel is the stack's build: the PR's patches and "
                          f"{', '.join(p.name for p in rest)}" if rest else
                          "the patched wheel is the stack's build of the PR's patches"],
            }
            (folder / PR_FILE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n",
                                          encoding="utf-8")
            written.append(pr.name)
    missing = sorted(set(names) - set(written))
    if missing or not written:
        raise MaintenanceError(f"stack {stack.name} has no upstream PR with GPU tests named "
                               f"{', '.join(missing) or '(any)'}", where=stack.name,
                               fix=f"list them: `{command('upstream-pr', stack.name)}`")
    return written


def run_tests(ws: Workspace, project: Project, tree: Path, files: list[str], *,
              python: str = sys.executable) -> list[TestRun]:
    """Each CPU test file run on ``tree``; GPU ones left with the command that runs them."""
    runs: list[TestRun] = []
    overlay: Path | None = None
    src = Path(__file__).resolve().parents[2]
    for rel in files:
        if needs_gpu(rel):
            runs.append(TestRun(path=rel, outcome="skip", summary="needs a GPU: not run here "
                                "(the offline kit runs it: --harness upstream_tests)"))
            continue
        if overlay is None and project.layout:  # the layout's probe overlay, made once
            from sm120fork.layouts import adapter

            ensure = getattr(adapter(project.layout), "ensure_overlay", None)
            overlay = ensure(ws.state_dir / "probe", python=python) if ensure else None
        env = {"PYTHONPATH": os.pathsep.join(
                   [*([str(overlay)] if overlay else []), str(tree / project.package_root),
                    str(src)]),
               "PYTHONPYCACHEPREFIX": str(ws.state_dir / "pycache-upstream-tests")}
        try:
            done = proc.run([python, "-m", "sm120fork.harness.fake_gpu", rel], cwd=tree,
                            env=env, check=False, timeout=1200)
        except CommandError as exc:  # it did not finish (timed out)
            runs.append(TestRun(path=rel, outcome="error", summary=str(exc)))
            continue
        runs.append(judge(rel, done.stdout + done.stderr, done.returncode))
    return runs


def judge(rel: str, output: str, returncode: int) -> TestRun:
    """A unittest file's run from its output: passed, failed, or could not run (no test
    ran), with its first error."""
    ran = re.findall(r"^Ran (\d+) tests?", output, re.MULTILINE)
    verdict = re.findall(r"^((?:OK|FAILED)\b.*)$", output, re.MULTILINE)
    if not ran or ran[-1] == "0":
        return TestRun(path=rel, outcome="error", summary="Ran 0 tests" if ran else
                       first_error(output) or f"exit status {returncode}, no output")
    summary = f"Ran {ran[-1]} tests: {verdict[-1] if verdict else 'no verdict'}"
    if returncode == 0 and verdict and verdict[-1].startswith("OK"):
        every_skipped = f"skipped={ran[-1]}" in verdict[-1]  # proves nothing
        return TestRun(path=rel, outcome="error" if every_skipped else "pass",
                       summary=summary)
    error = first_error(output)
    return TestRun(path=rel, outcome="fail",
                   summary=summary + (f"; first: {error}" if error else ""))


def first_error(output: str) -> str:
    """The line that ends ``output``'s first traceback, else its last line."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for after in lines[i + 1:]:
                if after.strip() and not after[0].isspace():
                    return after.strip()
    text = [line.strip() for line in lines if line.strip()]
    return text[-1] if text else ""


def find_pr(today: ResolvedStack, project_key: str | None, name: str
            ) -> tuple[Project, PlannedPR]:
    """PR ``name`` of ``project_key`` (default: of whichever project has it)."""
    stack = today.stack
    scope = [stack.project(project_key)] if project_key else stack.projects
    prs = [(project, pr) for project in scope for pr in plan_of(today, project).prs]
    if found := [(project, pr) for project, pr in prs if pr.name == name]:
        return found[0]
    where = "/".join([stack.name, *filter(None, [project_key])])
    raise MaintenanceError(f"{'' if project_key else 'stack '}{where} has no upstream PR "
                           f"{name!r} (its PRs: {', '.join(p.name for _, p in prs) or 'none'})",
                           where=where, fix=f"list them: `{command('upstream-pr', stack.name)}`")


def pr_record(stack: Stack, project: Project, pr: PlannedPR, tree: str,
              runs: list[TestRun]) -> record.Record:
    """What the PR was tested with (a record of kind ``upstream-pr``)."""
    cases = [record.Case(id=r.path, variant="patched", outcome=r.outcome,
                         detail=f"{r.summary}; run: {r.command}" if r.outcome == "skip"
                         else r.summary)
             for r in runs]
    return record.make(
        kind="upstream-pr", subject=pr.name, stack=stack.name,
        command=command("upstream-pr", stack.name, "--pr", pr.name),
        created=datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        toolkit=__version__,
        machine=record.Machine(description=f"CPU only, {os.cpu_count()} cores",
                               python=platform.python_version(), cpus=os.cpu_count()),
        tested=record.Tested(
            trees=(record.TestedTree(project=project.key, tree=tree),),
            patches=tuple(record.TestedPatch(project=project.key, patch=p.name,
                                             patch_id=p.patch_id)
                          for p in [*pr.patches, *pr.tests])),
        planned=len(runs), cases=tuple(cases),
        not_run=tuple(f"{r.path}: {r.summary}" for r in runs if r.outcome == "skip"),
        notes=(() if runs else ("the PR brings no test of its own",)))


def prepare(today: ResolvedStack, project_key: str | None, name: str, *,
            onto: str | None = None, repo: str | None = None, out: Path | None = None,
            run: bool = True, write: bool = False, even_if_failing: bool = False
            ) -> Prepared:
    """Make PR ``name``: its branch, its tests' runs and its package, refused if it leaks
    or (unless ``even_if_failing``) if a test of it failed or did not run."""
    ws, stack = today.ws, today.stack
    project, pr = find_pr(today, project_key, name)
    where = f"{stack.name}/{project.key}"
    with ws.lock():
        tree = open_tree(ws, stack, project)
        git = tree.repo
        who = git_identity(ws.root)
        base = branch_base(git, ws, stack.name, project, onto=onto, repo=repo)
        patches = [*pr.patches, *pr.tests]
        commits = _commit_all(git, base, patches, who,
                              onto or f"the {project.distribution} {project.version} release")
        branch = f"{pr.name}" + (f"-onto-{re.sub(r'[^A-Za-z0-9._-]', '-', onto)}" if onto
                                 else f"-{project.version}")
        git("update-ref", f"refs/heads/{branch}", commits[-1])
        title = (short_subject(pr.patches[0]) if len(pr.patches) == 1 else
                 pr.name.replace("-", " ").capitalize().replace("Sm12x", "SM12x"))
        folder = out or ws.state_dir / "upstream" / stack.name / project.key / pr.name
        words = fork_words(today)
        machine = [str(ws.root), str(Path.home()), str(tree.path)]
        with staged_dir(folder, label=pr.name) as staging:
            git("format-patch", "--quiet", "--zero-commit", "--no-signature", "-o",
                str(staging / "patches"), f"{base}..{commits[-1]}")
            _refuse_leaks(staging, words, machine, pr.name, where)
            runs = _run_pr_tests(ws, project, pr, git, commits[-1]) if run else [
                TestRun(path=f, outcome="skip", summary="not run: prepared without its tests")
                for f in _added_tests(pr.tests)]
            # The body cites the offline kit's GPU runs where their record is of this PR.
            cited = [_recorded_run(ws, stack.name, pr, r) if r.outcome == "skip" else r
                     for r in runs]
            if run and not even_if_failing:
                _refuse_untested(ws, cited, project, pr, stack.name)
            body = render_body(project.normalized_name, patches=list(pr.patches),
                               tests=list(pr.tests), runs=cited, onto=onto,
                               release=f"{project.distribution} {project.version}")
            (staging / "title.txt").write_text(title + "\n", encoding="utf-8")
            (staging / "body.md").write_text(body, encoding="utf-8")
            _refuse_leaks(staging, words, machine, pr.name, where)
        commands = push_commands(ws, project, branch, title, onto=onto, tree=tree.path,
                                 body=folder / "body.md")
        files = tuple(sorted(p for p in folder.rglob("*") if p.is_file()))
        rec = pr_record(stack, project, pr, git("rev-parse", f"{commits[-1]}^{{tree}}"),
                        runs) if run else None
        published = (record.write(rec, ws.reports_dir) if rec and write and not onto
                     and any(r.outcome != "skip" for r in runs) else None)
        return Prepared(branch=branch, base=base, onto=onto, out=folder,
                        commits=tuple(commits), runs=tuple(runs), commands=tuple(commands),
                        files=files, record=rec, published=published)


def _run_pr_tests(ws: Workspace, project: Project, pr: PlannedPR, git: Git,
                  commit: str) -> list[TestRun]:
    """The PR's tests run on a scratch worktree of ``commit`` (the PR's branch)."""
    with tempfile.TemporaryDirectory(prefix="upstream-pr-tree.") as scratch:
        work = Path(scratch) / "tree"
        git("worktree", "add", "--quiet", "--detach", str(work), commit)
        try:
            return run_tests(ws, project, work, _added_tests(pr.tests))
        finally:
            git("worktree", "remove", "--force", str(work))


def push_commands(ws: Workspace, project: Project, branch: str, title: str, *,
                  onto: str | None, tree: Path, body: Path) -> list[str]:
    """``git push`` and ``gh pr create`` to paste in the checkout root."""
    slug = github_slug(upstream_url(ws, project)) or "<owner>/<repo>"
    commands = [
        f"git -C {shlex.quote(os.path.relpath(tree, ws.root))} push <your-fork-url> "
        f"{branch}:{branch}",
        f"gh pr create --repo {slug} --base main --head <your-github-user>:{branch} "
        f"--title {shlex.quote(title)} --body-file "
        f"{shlex.quote(os.path.relpath(body, ws.root))}",
    ]
    if not onto:
        commands.insert(0, f"# this branch sits on the {project.distribution} "
                           f"{project.version} release as published, not on upstream's "
                           "history: rebase it onto upstream's main first")
    return commands


def _refuse_untested(ws: Workspace, runs: list[TestRun], project: Project, pr: PlannedPR,
                     stack: str) -> None:
    """Refuse a package whose tests did not all pass."""
    bad = [r for r in runs if not r.passed]
    if not bad:
        return
    again = command("upstream-pr", stack, "--pr", pr.name)
    fixes = [f"to write it anyway, its body saying so: `{again} --even-if-failing`"]
    lacking = unmet(pr_requirements(ws, project, pr)) if any(
        r.outcome == "error" for r in bad) else []
    if lacking:
        listed = command("upstream-pr", stack, "--pr", pr.name, "--requirements")
        more = f" and {len(lacking) - 3} more" if len(lacking) > 3 else ""
        fixes.insert(0, f"this Python lacks {', '.join(lacking[:3])}{more} of what the "
                        "tests import: " + (f"`{again}` installs them" if via_nox() else
                                            f"`python -m pip install $({listed})`"))
    if any(r.outcome == "skip" for r in bad):
        kit = command("gpu-kit", "--stack", stack, "--python", "<X.Y>", "--harness",
                      "upstream_tests", "--upstream-pr", pr.name, "--out", "DIR")
        fixes.insert(0, f"run its GPU tests with the offline kit (`{kit}`, then "
                        f"docs/upstream.md) and import their record")
    raise MaintenanceError(
        f"PR {pr.name}: no package written, {len(bad)} of its {len(runs)} test file(s) did "
        "not pass: " + "; ".join(f"{r.path}: {r.said}: {r.summary}" for r in bad),
        where=f"{stack}/{project.key}", fix="; ".join(fixes))


#: pyproject.toml's dependency group of the fake-GPU probe, which SGLang's CPU tests import.
PROBE_GROUP = "sglang-probe"


def pr_requirements(ws: Workspace, project: Project, pr: PlannedPR) -> list[str]:
    """What ``pr``'s CPU tests import beyond the toolkit: the probe's group for an SGLang
    layout (the overlay is installed when they run)."""
    if not project.layout or all(needs_gpu(f) for f in _added_tests(pr.tests)):
        return []
    return dependency_group(ws.root / "pyproject.toml", PROBE_GROUP)


def dependency_group(pyproject: Path, name: str) -> list[str]:
    """A PEP 735 dependency group of ``pyproject``, its ``include-group`` entries expanded."""
    groups = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("dependency-groups", {})
    if name not in groups:
        raise ConfigError(f"no dependency group {name!r}", where=str(pyproject),
                          fix=f"add [dependency-groups] {name} = [...]")
    return [req for item in groups[name] for req in (
        [item] if isinstance(item, str) else dependency_group(pyproject, item["include-group"]))]


def unmet(required: list[str]) -> list[str]:
    """Those of ``required`` that this Python's installed distributions do not satisfy."""
    return [line for line in required if not _installed(Requirement(line))]


def _installed(req: Requirement) -> bool:
    try:
        return req.specifier.contains(metadata.version(req.name), prereleases=True)
    except metadata.PackageNotFoundError:
        return False


def _recorded_run(ws: Workspace, stack: str, pr: PlannedPR, run: TestRun) -> TestRun:
    """``run`` (not run here) as the PR's published, finished record of these patches ran it."""
    path = ws.reports_dir / stack / "upstream-pr" / pr.name / record.RECORD_FILE
    if not path.is_file():
        return run
    rec = record.read(path)
    tested = {(p.patch, p.patch_id) for p in rec.tested.patches}
    mine = [c for c in rec.cases if c.id.split("::", 1)[0] == run.path
            and c.variant not in record.BASELINE_VARIANTS]
    if not rec.finished or not mine or not all(
            (p.name, p.patch_id) in tested for p in (*pr.patches, *pr.tests)):
        return run
    counts = record.tally(mine)
    summary = ", ".join(f"{n} {word}" for word, n in (
        ("passed", counts["pass"]), ("failed", counts["fail"] + counts["error"]),
        ("skipped", counts["skip"])) if n)
    fixed = sum(c.against == "fixed" for c in mine)
    if any(c.against for c in mine):
        summary += (f"; without this PR {fixed} of them fail" if fixed
                    else "; they pass without this PR too")
    passed = bool(counts["pass"]) and not counts["fail"] + counts["error"]
    return TestRun(path=run.path, outcome="pass" if passed else "fail", summary=summary,
                   where=f"on {rec.machine.description}")


def _refuse_leaks(staging: Path, words: list[str], machine: list[str], pr: str,
                  where: str) -> None:
    """Refuse a package that names the fork, a stack, a patch id or this machine."""
    found = leaks(staging, words, paths=machine)
    if not found:
        return
    raise MaintenanceError(
        f"PR {pr} would carry the fork's own words or this machine's paths: "
        + "; ".join(found[:12]) + (f"; and {len(found) - 12} more" if len(found) > 12
                                   else ""),
        where=where,
        fix="word the patch (its code, Subject and Description) as upstream would; "
            "split what only the fork needs into a Forwarded: not-needed patch on top")
