"""Stock sglang 0.5.23, patched by its series, and the plugin built from that series; and
the default stack's sglang 0.5.10 trees.

The session fixture ``sites`` (network, ~2 min) is shared by the plugin's tests
(tests/plugin/test_plugin_sglang.py) and the fail-closed tests (tests/gpu/test_fail_closed.py).
The session fixtures ``sglang_0510`` and ``sglang_0510_upstream`` (the 0.5.10.post1 sdist,
patched by S1-S4 and as published, by the toolkit's own pipeline) are shared by
tests/layouts/test_verify_sglang.py, tests/layouts/test_policy_sglang.py and
tests/gpu/test_fail_closed.py.  The session fixture ``sglang_next_verify`` (sglang-0.5.23
renamed, verified end to end) is shared by tests/layouts/test_layouts.py and
tests/layouts/test_stack2.py.  All are made once per run and are read-only to tests: a
test that would change one works on a copy.
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import os
import pickle
import py_compile
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sm120fork.plugin import build as plugin_build
from sm120fork.plugin import runtime
from sm120fork.plugin.generate import generate_spec, patch_commits
from sm120fork.util.git import Git
from sm120fork.verify.proof.patches import VERIFY_STACK_ENV
from sm120fork.verify.proof.stack import VerifyResult

from conftest import git, isolate_git

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: The stack whose build the fixture ``sites`` installs: the stack verify-sm120 runs a
#: claim's test for (``VERIFY_STACK_ENV``, so a copy of sglang-0.5.23 under another name
#: tests its own series), else sglang-0.5.23.
STACK = os.environ.get(VERIFY_STACK_ENV) or "sglang-0.5.23"
SERIES = ROOT / "patches" / STACK / "sglang"
#: What the modules under test import beyond the test group, at sglang 0.5.23's pins.
PROBE_DEPS = TESTS / "requirements-sglang-0.5.23.txt"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


@dataclass(frozen=True)
class Sites:
    stock: Path
    patched: Path
    plugin: Path
    deps: Path
    spec: runtime.Spec
    patch_ids: list[str]
    #: The interpreter for children that import these sites (``zygote_python``).
    python: str


def _patch_names() -> list[str]:
    lines = (SERIES / "series").read_text().splitlines()
    return [n.strip() for n in lines if n.strip() and not n.startswith("#")]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                 make: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``make`` fills, made once per run, not once per xdist
    worker: the files that use it may run on different workers, and the second one waits
    for the first one's build (a file lock in the run's shared temp directory) instead of
    building it again."""
    own = tmp_path_factory.getbasetemp()
    shared = own.parent if os.environ.get("PYTEST_XDIST_WORKER") else own
    base = shared / name
    with _locked(shared / f"{name}.lock"):
        if not (base / ".complete").is_file():
            if base.exists():
                shutil.rmtree(base)
            base.mkdir()
            make(base)
            (base / ".complete").write_text("")
    return base


#: The stack of the 0.5.10 trees (its SGLang series is S1-S4): the stack verify-sm120 runs
#: a claim's test for (a copy of the default stack builds its own series), else the
#: default stack.
DEFAULT_STACK = os.environ.get(VERIFY_STACK_ENV) or "sglang-0.5.10"


def _tree_0510(tmp_path_factory: pytest.TempPathFactory, variant: str) -> Path:
    """The default stack's sglang tree ``variant`` ("": patched by its series,
    "unpatched": as published), made by the toolkit's ``prepare_tree`` in a toolkit root
    copied from this checkout; each variant on its own, so a run that needs one makes one."""
    from sm120fork.patch.tree import prepare_tree
    from sm120fork.resolved import ResolvedStack
    from sm120fork.workspace import Workspace

    from helpers_ws import checkout_copy

    def make(base: Path) -> None:
        ws = Workspace(checkout_copy(base))
        stack = ws.stack(DEFAULT_STACK)
        series = ResolvedStack.of(ws, stack).series["sglang"]
        tree = prepare_tree(ws, stack, stack.project("sglang"),
                            patches=() if variant else series.patches, variant=variant).path
        # Byte code compiled once here, as for the sites: the probes and ranks importing
        # this tree run with PYTHONDONTWRITEBYTECODE.  git does not see it (info/exclude),
        # so the fork tree stays clean.
        compileall.compile_dir(tree / "python", quiet=1)
        exclude = tree / git(tree, "rev-parse", "--git-path", "info/exclude")
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a", encoding="utf-8") as handle:
            handle.write("__pycache__/\n")

    base = once_per_run(tmp_path_factory, f"tree-{DEFAULT_STACK}-{variant or 'patched'}", make)
    ws = Workspace(base / "toolkit")
    stack = ws.stack(DEFAULT_STACK)
    return ws.work_tree(stack, stack.project("sglang"), variant)


@pytest.fixture(scope="session")
def sglang_0510(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default stack's sglang patched by its series (S1-S4): the repository root, the
    package under ``python/``.  Shared by the run, read only."""
    return _tree_0510(tmp_path_factory, "")


@pytest.fixture(scope="session")
def sglang_0510_upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default stack's sglang as published (variant "unpatched").  Shared, read only."""
    return _tree_0510(tmp_path_factory, "unpatched")


@pytest.fixture(scope="session")
def sites(tmp_path_factory: pytest.TempPathFactory, zygote_python: str) -> Sites:
    """Made once per run (``once_per_run``)."""
    base = once_per_run(tmp_path_factory, f"sites-{STACK}", _make_sites)
    repo = Git(base / "fork")
    ids = [n.split("-")[1] for n in _patch_names()]
    spec = generate_spec(repo, patch_commits(repo, ids), prefix="python/",
                         package="sglang", stack=STACK, distribution="sglang",
                         version=_version())
    return Sites(stock=base / "stock", patched=base / "patched", plugin=base / "plugin",
                 deps=base / "deps", spec=spec, patch_ids=ids, python=zygote_python)


def _version() -> str:
    """The SGLang release :data:`STACK` pins."""
    from sm120fork.workspace import Workspace

    return Workspace(ROOT).stack(STACK).project("sglang").version


def _make_sites(base: Path) -> None:
    version = _version()
    pip("download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
        "--platform", "manylinux_2_34_x86_64", f"sglang=={version}", "-d", str(base / "dl"))
    # Byte code compiled once here: the probes and ranks that import these sites run
    # with PYTHONDONTWRITEBYTECODE (CI and the toolkit's own probes set it), so without
    # it every fresh interpreter compiled sglang and transformers again.
    pip("install", "--no-deps", "--target", str(base / "stock"),
        str(base / "dl" / f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"))
    pip("install", "--no-deps", "--target", str(base / "deps"),
        "-r", str(PROBE_DEPS))

    fork = base / "fork"
    fork.mkdir()
    git(fork, "init", "-q", "-b", "main")
    names = _patch_names()
    touched = sorted({line.split(" b/", 1)[1] for n in names
                      for line in (SERIES / n).read_text().splitlines()
                      if line.startswith("diff --git ")})
    for rel in touched:
        target = fork / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        published = base / "stock" / rel.removeprefix("python/")
        if published.exists():  # else a module the series adds
            shutil.copyfile(published, target)
    git(fork, "add", "-A")
    git(fork, "commit", "-q", "-m", f"sglang {version} as published")
    git(fork, "tag", "upstream")
    git(fork, "am", "-q", *(str(SERIES / n) for n in names))
    repo = Git(fork)
    ids = [n.split("-")[1] for n in names]
    spec = generate_spec(repo, patch_commits(repo, ids), prefix="python/",
                         package="sglang", stack=STACK, distribution="sglang",
                         version=version)
    built = plugin_build.build_plugin_wheel(spec, "sm120.1", base / "plugin-cache")
    pip("install", "--no-deps", "--target", str(base / "plugin"),
        str(built.wheel))

    patched = base / "patched"
    shutil.copytree(base / "stock", patched, copy_function=os.link)
    for rel in touched:
        dest = patched / rel.removeprefix("python/")
        dest.unlink(missing_ok=True)
        shutil.copyfile(fork / rel, dest)
        # its own byte code (written beside, replacing the link to stock's, not stock's)
        py_compile.compile(str(dest), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)


#: The interpreter the behaviour probes run on (it needs the sglang-probe group).
PROBE_PYTHON = os.environ.get("SM120FORK_VERIFY_PYTHON", sys.executable)


def zpython(folder: Path, real: str) -> Path:
    """An executable that runs ``real`` on its arguments through a server of
    tests/zygote.py that imported torch and SGLang's other libraries once (servers and
    their sockets in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "zpython"
    if not path.is_file():
        text = (f"#!{real} -SE\nimport sys\nsys.path.insert(0, {str(TESTS)!r})\n"
                f"import zygote\nzygote.client({real!r}, {str(folder)!r}, sys.argv[1:])\n")
        scratch = path.with_suffix(f".{os.getpid()}")
        scratch.write_text(text)
        scratch.chmod(0o755)
        scratch.replace(path)
    return path


@pytest.fixture(scope="session")
def zygote_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter for the toolkit's probes and ranks in tests: :data:`PROBE_PYTHON`
    behind a forking pre-import server (tests/zygote.py), shared by the run's workers.
    The same modules run in the children; only the libraries' imports are shared.
    ``SM120FORK_TEST_ZYGOTE=0``: every child is a fresh interpreter."""
    if os.environ.get("SM120FORK_TEST_ZYGOTE") == "0":
        return PROBE_PYTHON
    own = tmp_path_factory.getbasetemp()
    shared = own.parent if os.environ.get("PYTEST_XDIST_WORKER") else own
    return str(zpython(shared / "zyg", PROBE_PYTHON))


def copy_stack(root: Path, source: str, name: str, *, keep_wheels: int) -> None:
    """``source`` under the name ``name``: its toml (one wheel per project kept, to build
    fast) and its patches, nothing else."""
    text = (root / "forks" / f"{source}.toml").read_text()
    text = text.replace(f'name = "{source}"', f'name = "{name}"')
    text = text.replace(f'series = "patches/{source}/', f'series = "patches/{name}/')
    blocks = text.split("[[projects.sglang.wheels]]")
    text = "[[projects.sglang.wheels]]".join(blocks[:1 + keep_wheels])
    (root / "forks" / f"{name}.toml").write_text(text)
    shutil.copytree(root / "patches" / source, root / "patches" / name)


@pytest.fixture(scope="session")
def sglang_next_verify(tmp_path_factory: pytest.TempPathFactory,
                       zygote_python: str) -> VerifyResult:
    """``run_verify`` of sglang-0.5.23 copied under the name ``sglang-next`` (its toml with
    its first wheel, its patches; nothing in the toolkit names the stack): the build, the
    fingerprints and the layer_boundary checks (``check`` of the patched tree against
    the unpatched one, made from the same published wheel and series as sglang-0.5.23's
    own).  Made once per run: test_layouts asserts the verdicts, test_stack2 the checks."""
    from sm120fork.verify.proof.stack import run_verify
    from sm120fork.workspace import Workspace

    from helpers_ws import CHECKOUT, checkout_copy

    def make(base: Path) -> None:
        with pytest.MonkeyPatch.context() as mp:
            isolate_git(mp, base)
            root = checkout_copy(base, sdists=False)
            cache = CHECKOUT / ".forks" / "cache" / "wheels"
            cache.mkdir(parents=True, exist_ok=True)
            (root / ".forks" / "cache").mkdir(parents=True)
            (root / ".forks" / "cache" / "wheels").symlink_to(cache)
            (CHECKOUT / ".forks" / "probe").mkdir(exist_ok=True)  # the overlay, shared
            (root / ".forks" / "probe").symlink_to(CHECKOUT / ".forks" / "probe")
            copy_stack(root, "sglang-0.5.23", "sglang-next", keep_wheels=1)
            ws = Workspace(root)
            result = run_verify(ws, ws.stack("sglang-next"), python=zygote_python)
        (base / "result.pickle").write_bytes(pickle.dumps(result))

    base = once_per_run(tmp_path_factory, "verify-sglang-next", make)
    result: VerifyResult = pickle.loads((base / "result.pickle").read_bytes())
    return result
