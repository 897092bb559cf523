"""Shared fixtures: real git repos and tiny upstream projects in temp dirs."""

from __future__ import annotations

import os
import subprocess
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The session fixture ``sites`` (stock sglang 0.5.23, patched, and with the plugin), and
#: the bump workspace ``bw``.
pytest_plugins = ["helpers_sglang", "helpers_maintain"]

FIXED_DATE = "2026-11-29T00:00:00+00:00"
PATCH_AUTHOR = "SM12x fork maintainers <sm12x-fork@users.noreply.invalid>"


#: The files that take minutes (each builds or probes real SGLang trees, or builds a stack
#: from its sdist; all but the last under `nox -s e2e`), longest first, by their durations
#: in fresh-clone runs (2 workers).  nox hands whole files to the two workers in collection order
#: (``--no-loadscope-reorder``): the last file to start bounds the run, so these start
#: first and the many short files fill in around them.  (xdist's default order, most
#: tests first, started them last.)
LONGEST_FIRST = (
    "layouts/test_verify_sglang.py",
    "cli/test_e2e_flashinfer_stack.py",
    "gpu/test_fail_closed.py",
    "cli/test_e2e_default_stack.py",
    "gpu/test_layer_policy_sglang.py",
    "layouts/test_stack2.py",
    "plugin/test_plugin_policy.py",
    "plugin/test_plugin_sglang.py",
    "kit/test_kit.py",
    "layouts/test_layouts.py",
    "upstream/test_upstream_groups.py",
)


#: The session fixtures of helpers_sglang made from real upstream releases (downloads,
#: minutes): a test using one is an end-to-end test (``network``).
REAL_RELEASES = frozenset({"sites", "sglang_0510", "sglang_0510_upstream",
                           "sglang_next_verify"})


def _start_rank(item: pytest.Item) -> int:
    where = item.path.relative_to(Path(__file__).parent).as_posix()
    return LONGEST_FIRST.index(where) if where in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test using a real release's fixture must be marked ``network``.  Each test says
    which stack's build it runs (``runs_stack`` marks, or the fixture
    ``sites``: sglang 0.5.23), as a JUnit property verify reads: a ``cpu:`` claim counts
    only for the stack its test ran on.  The longest files run first (a stable sort: the
    order within a file, and of the other files, stays)."""
    from helpers_sglang import STACK as SITES_STACK

    for item in items:
        real = REAL_RELEASES.intersection(getattr(item, "fixturenames", ()))
        if real and item.get_closest_marker("network") is None:
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(real))} (a real upstream release) but "
                "is not marked network: mark it, so that `nox -s e2e` runs it and "
                "`nox -s tests` does not")
        stacks = [str(m.args[0]) for m in item.iter_markers("runs_stack")]
        if "sites" in getattr(item, "fixturenames", ()):
            stacks.append(SITES_STACK)
        item.user_properties.extend(("runs_stack", s) for s in dict.fromkeys(stacks))
    items.sort(key=_start_rank)


@pytest.fixture(autouse=True)
def _git_isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed identity/dates, no user config, and no repo above tmp_path."""
    isolate_git(monkeypatch, tmp_path)


def isolate_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What every test runs under; a module fixture that makes repositories (before any
    test's own isolation) calls it with a ``pytest.MonkeyPatch.context()``."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR", "GIT_COMMITTER"):
        monkeypatch.setenv(f"{var}_NAME", "Test")
        monkeypatch.setenv(f"{var}_EMAIL", "test@example.invalid")
        monkeypatch.setenv(f"{var}_DATE", FIXED_DATE)
    monkeypatch.delenv("SM120FORK_ROOT", raising=False)


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env=full).stdout.strip()


UPSTREAM_FILES = {
    "pyproject.toml": """\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        dynamic = ["version"]
        {deps}

        [tool.setuptools.dynamic]
        version = {{ attr = "{pkg}._version.__version__" }}

        [tool.setuptools.packages.find]
        include = ["{pkg}*"]

        [tool.setuptools.package-data]
        "*" = ["*.cuh"]
        """,
    "{pkg}/__init__.py": """\
        from {pkg}._version import __version__

        def supported_majors():
            return [9, 10]
        """,
    "{pkg}/_version.py": '__version__ = "{version}"\n',
    "{pkg}/kernel.cuh": """\
        #if __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200
        void body() {{}}
        #endif
        """,
    "tests/test_x.py": "def test_x():\n    pass\n",
}


@dataclass
class Upstream:
    """A tiny upstream project: as a git repo and as an sdist."""

    name: str
    pkg: str
    version: str
    repo: Path
    commit: str
    sdist: Path


def make_upstream(base: Path, name: str = "demo-lib", version: str = "1.2.3",
                  deps: str = "", files: dict[str, str] | None = None) -> Upstream:
    pkg = name.replace("-", "_")
    repo = base / f"{name}-repo"
    repo.mkdir(parents=True)
    contents = dict(UPSTREAM_FILES)
    contents.update(files or {})
    dep_line = f"dependencies = [{deps}]" if deps else ""
    for rel, text in contents.items():
        path = repo / rel.format(pkg=pkg)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).format(name=name, pkg=pkg, version=version,
                                                     deps=dep_line))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"release {version}")
    commit = git(repo, "rev-parse", "HEAD")
    sdist = base / f"{pkg}-{version}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for path in sorted(repo.rglob("*")):
            if ".git" in path.relative_to(repo).parts or not path.is_file():
                continue
            tf.add(path, arcname=f"{pkg}-{version}/{path.relative_to(repo)}")
    return Upstream(name=name, pkg=pkg, version=version, repo=repo, commit=commit, sdist=sdist)


def make_patch(upstream_repo: Path, out_dir: Path, subject: str, edits: dict[str, tuple[str, str]],
               fingerprint: str, extra_fields: str = "") -> Path:
    """Commit ``edits`` (path -> (old, new)) on the ``scratch`` branch and format-patch it.

    Successive calls stack their commits, as a series does.
    """
    branches = git(upstream_repo, "branch", "--list", "scratch")
    git(upstream_repo, "checkout", "-q", *(["scratch"] if branches else ["-b", "scratch", "main"]))
    for rel, (old, new) in edits.items():
        path = upstream_repo / rel
        text = path.read_text() if path.exists() else ""
        assert old in text, (rel, old)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace(old, new, 1) if old else new)
    git(upstream_repo, "add", "-A")
    message = (f"{subject}\n\nDescription: {subject}\nOrigin: vendor, test\nForwarded: no\n"
               f"{extra_fields}Last-Update: 2026-11-29\nFingerprint: {fingerprint}\n")
    git(upstream_repo, "commit", "-q", "-m", message, "--author", PATCH_AUTHOR)
    out_dir.mkdir(parents=True, exist_ok=True)
    existing = len(list(out_dir.glob("*.patch")))
    name = git(upstream_repo, "format-patch", "--zero-commit", "--no-signature", "--full-index",
               "--no-numbered", f"--start-number={existing + 1}", "-o", str(out_dir), "-1")
    return Path(name)


def write_series(directory: Path, names: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "series").write_text("".join(f"{n}\n" for n in names))


def stack_toml(name: str, projects: list[dict[str, str]], default: bool = True) -> str:
    out = [f'[stack]\nname = "{name}"\ndefault = {str(default).lower()}\n']
    for p in projects:
        key = p["key"]
        out.append(textwrap.dedent(f"""
            [projects.{key}]
            distribution = "{p['distribution']}"
            version = "{p['version']}"
            local_label = "{p.get('label', 'sm120.1')}"
            package_root = "{p.get('root', '.')}"
            series = "patches/{name}/{key}"
            source = "{p.get('source', 'sdist')}"
            {p.get('requires', '')}

            [projects.{key}.git]
            url = "{p.get('git_url', 'https://example.invalid/x.git')}"
            tag = "v{p['version']}"
            commit = "{p['commit']}"

            [projects.{key}.sdist]
            filename = "{p['filename']}"
            sha256 = "{p['sha256']}"
            url = "{p['url']}"

            [projects.{key}.version_stamp]
            file = "{p['stamp']}"
            """))
    return "".join(out)


@pytest.fixture
def gpu_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU harness's preflight answers as on a box with two GPUs (the ranks are fakes)."""
    from sm120fork.gpu.core import safety as preflight

    monkeypatch.setattr(preflight, "require_gpu", lambda **_: preflight.GpuHost(
        torch="2.11.0", cuda="13.0", gpus=("Fake GPU", "Fake GPU")))
