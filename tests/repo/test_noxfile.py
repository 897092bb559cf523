"""The front door: which Python the build runs on, and what the toolkit's sessions run."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from sm120fork.cli.main import VERBS, make_parser

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _noxfile() -> ModuleType:
    """Loaded once: nox registers each session when the file runs."""
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_runs_on_a_machine_that_has_only_python_3_12() -> None:
    nf = _noxfile()
    only_312 = {"python3.12": "/usr/bin/python3.12"}.get
    assert nf.first_python((3, 12), only_312) == "3.12"  # nox itself on 3.12
    assert nf.first_python((3, 10), only_312) == "3.12"  # nox on an older Python
    assert nf.first_python((3, 13), only_312) == "3.13"
    running = (sys.version_info.major, sys.version_info.minor)
    assert nf.build.python == nf.first_python(running)


class _Recorder:
    """What a session asks nox to run (a stand-in for nox.Session)."""

    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs
        self.virtualenv = SimpleNamespace(location=None)  # no environment: install runs
        self.runs: list[tuple[tuple[str, ...], dict[str, object]]] = []

    def install(self, *args: str) -> None:
        pass

    def run(self, *args: str, **kwargs: object) -> None:
        self.runs.append((args, kwargs))


class _Installing(_Recorder):
    """A recorder that keeps what is installed and answers ``--requirements`` with
    ``requirements``."""

    def __init__(self, posargs: list[str], requirements: str) -> None:
        super().__init__(posargs)
        self.requirements = requirements
        self.installs: list[tuple[str, ...]] = []

    def install(self, *args: str) -> None:
        self.installs.append(args)

    def run(self, *args: str, **kwargs: object) -> str:  # type: ignore[override]
        super().run(*args, **kwargs)
        return self.requirements if "--requirements" in args else ""


def test_toolkit_sessions_print_nox_hints_and_keep_stderr_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under nox the hints say `nox -s ...`, and stdout carries only the toolkit's stdout
    (nox merges stderr into it unless told not to: `status -- --json` would not parse)."""
    nf = _noxfile()
    monkeypatch.setattr(nf, "ready", lambda *_: None)  # the preflight: its own tests
    for name in ("build", "status", "bump", "refresh", "upstream_pr", "verify_sm120",
                 "gpu_test", "sglang_layer", "bench", "doctor", "build_aot"):
        session = _Recorder(["--json"])
        getattr(nf, name).func(session)
        runs = [r for r in session.runs if r[0][:3] == ("python", "-m", "sm120fork")]
        args, _ = runs[-1]  # the verb (a GPU session asks gpu-requirements first)
        assert args[-1] == "--json", name
        for _, kwargs in runs:
            assert kwargs["env"] == {"SM120FORK_FRONT_DOOR": "nox"}, name
            assert kwargs["stderr"] is None, name


def test_upstream_pr_installs_what_the_prs_tests_import_before_it_prepares_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The session asks the toolkit (same arguments) what the PR's tests import, installs
    that, then runs the verb: a fresh clone's session runs SGLang's CPU tests."""
    nf = _noxfile()
    monkeypatch.setattr(nf, "ready", lambda *_: None)  # the preflight: its own tests

    session = _Installing(["sglang-0.5.23", "--pr", "x"], "torch==2.13.0\nnumpy==2.4.6\n")
    nf.upstream_pr.func(session)
    asked, last = session.runs[0][0], session.runs[-1][0]
    assert asked[3:] == ("-q", "upstream-pr", "--requirements", "sglang-0.5.23", "--pr", "x")
    assert session.installs[-1] == ("-q", "torch==2.13.0", "numpy==2.4.6")
    assert last[3:] == ("upstream-pr", "sglang-0.5.23", "--pr", "x")


def test_sessions_that_probe_a_tree_install_the_cpu_torch_before_any_torch_pin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe imports torch on the CPU: a session that probes installs PyTorch's CPU build
    first, so the pins after it (the probe's group, a PR's test requirements) are met by it
    instead of pulling the CUDA build's 10 GB of libraries onto a user's machine."""
    nf = _noxfile()
    monkeypatch.setattr(nf, "ready", lambda *_: None)  # the preflight: its own tests

    cpu = ("-q", "-r", "aot/requirements-torch-cpu.txt")
    for name in ("build", "bump", "watch", "upstream_pr", "verify_sm120"):
        session = _Installing(["x"], "torch==2.13.0\n")
        getattr(nf, name).func(session)
        pins = [i for i, args in enumerate(session.installs)
                if any(a.startswith("torch") for a in args)]
        assert pins, name
        assert cpu in session.installs, name
        assert session.installs.index(cpu) < pins[0], name


def test_every_session_a_hint_names_exists() -> None:
    """A hint runs as printed: `nox -s <session>` of each verb is a session of the noxfile."""
    from sm120fork.util import hint

    nf = _noxfile()
    for verb, session in hint._SESSIONS.items():
        assert callable(getattr(nf, session, None)), (verb, session)
    assert hint._SESSIONS["gpu sglang-layer"] == "sglang_layer"


class _Session:
    def __init__(self, venv: Path, *, no_install: bool = False) -> None:
        self.virtualenv = SimpleNamespace(location=str(venv))
        self.installs: list[tuple[str, ...]] = []
        self.logs: list[str] = []
        self.no_install = no_install  # nox -R: installs skipped, the environment reused

    def install(self, *args: str) -> None:
        if not self.no_install:
            self.installs.append(args)

    def run_install(self, *args: str, silent: bool = False, log: bool = True) -> str | None:
        return None if self.no_install else ""

    def log(self, text: str) -> None:
        self.logs.append(text)


def test_a_second_session_skips_the_install_a_new_environment_does_not(
        tmp_path: Path) -> None:
    nf = _noxfile()
    session = _Session(tmp_path / "venv")
    (tmp_path / "venv").mkdir()
    nf.install(session, ".")
    nf.install(session, ".")
    nf.install(session, "-e", ".", "pytest>=8")  # another install: its own stamp
    assert session.installs == [("-q", "."), ("-q", "-e", ".", "pytest>=8")]
    assert session.logs == ["already installed, unchanged: ."]
    fresh = _Session(tmp_path / "fresh")
    (tmp_path / "fresh").mkdir()
    nf.install(fresh, ".")
    assert fresh.installs == [("-q", ".")]


def test_an_install_nox_skipped_leaves_no_stamp(tmp_path: Path) -> None:
    """Issue 41 trial: `nox -R -s upstream_pr -- STACK --pr NAME` (-R: --no-install) skipped
    the install of what the PR's tests import but stamped it, so the session its error
    names, `nox -s upstream_pr -- STACK --pr NAME`, said "already installed" and the tests
    met ModuleNotFoundError again."""
    nf = _noxfile()
    (tmp_path / "venv").mkdir()
    nf.install(_Session(tmp_path / "venv", no_install=True), "numpy==2.4.6")
    session = _Session(tmp_path / "venv")
    nf.install(session, "numpy==2.4.6")
    assert session.installs == [("-q", "numpy==2.4.6")]
    assert session.logs == []


def test_the_stamp_follows_the_sources_of_a_copy_not_of_an_editable_install(
        tmp_path: Path) -> None:
    nf = _noxfile()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    module = tmp_path / "src" / "pkg" / "a.py"
    module.write_text("one\n")
    (tmp_path / "req.txt").write_text("a==1\n")
    copy, editable, req = (".",), ("-e", ".", "pytest"), ("-r", "req.txt")
    before = {args: nf.install_stamp(tmp_path, args) for args in (copy, editable, req)}
    module.write_text("two\n")
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "src" / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"x")
    assert nf.install_stamp(tmp_path, copy) != before[copy]
    assert nf.install_stamp(tmp_path, editable) == before[editable]
    assert nf.install_stamp(tmp_path, req) == before[req]
    (tmp_path / "req.txt").write_text("a==2\n")
    assert nf.install_stamp(tmp_path, req) != before[req]
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    assert nf.install_stamp(tmp_path, editable) != before[editable]


def _collected(args: tuple[str, ...]) -> set[str]:
    """The node ids pytest would run with ``args`` (the session's, without xdist's)."""
    import subprocess

    plain = [a for a in args if a not in ("--dist", "loadfile", "-n", "auto",
                                          "--no-loadscope-reorder")]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *plain], cwd=ROOT, check=True,
                          capture_output=True, text=True)
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_suite_and_the_e2e_session_split_the_tests_between_them() -> None:
    """`nox -s tests` runs no test that downloads a real upstream release; `nox -s e2e`
    runs exactly those; together every test, none twice.  (The fixtures made of real
    releases are refused on an unmarked test at collection: tests/conftest.py.)"""
    nf = _noxfile()
    chosen = {}
    for name in ("tests", "e2e"):
        session = _Recorder([])
        getattr(nf, name).func(session)
        ((args, _),) = session.runs
        assert args[0] == "pytest"
        chosen[name] = _collected(args[1:])
    everything = _collected(())
    assert chosen["tests"]
    assert chosen["e2e"]
    assert not chosen["tests"] & chosen["e2e"]
    assert chosen["tests"] | chosen["e2e"] == everything
    assert "tests/cli/test_e2e_default_stack.py::test_wheels_install_and_carry_the_patched_gates" \
        in chosen["e2e"]


def _nox(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str], float]:
    """nox itself on this noxfile: its exit code, its output's lines and its time."""
    import os
    import subprocess
    import time

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nox", "--noxfile", str(ROOT / "noxfile.py"),
                           *args], capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, **(env or {})})
    return done.returncode, (done.stdout + done.stderr).splitlines(), time.monotonic() - start


@pytest.mark.parametrize(("session", "args", "says"), [
    ("sglang_layer", [], "nox -s sglang_layer: the following arguments are required: --out "
                         "(see nox -s sglang_layer -- --help)"),
    ("tune", [], "nox -s tune: the following arguments are required: --stack"),
    ("gpu_kit", [], "nox -s gpu_kit: the following arguments are required: --python, --out"),
    ("record_import", [], "nox -s record_import: the following arguments are required: DIR"),
    # nox's Python finds a CPU build of torch first (a stand-in on PYTHONPATH)
    ("gpu_test", ["--quick"], "is a CPU-only build (run it on a GPU box with the Python "
                              "that has its CUDA torch: /path/to/python -m nox -s gpu_test;"),
    ("bench", [], "is a CPU-only build (run it on a GPU box"),
    ("cibuildwheel", [], "cibuildwheel builds in containers: neither docker nor podman is on "
                         "PATH (install one of them, or build the same wheel on this machine: "
                         "nox -s build_aot)"),
])
def test_a_mistake_ends_the_session_in_one_line_before_anything_is_installed(
        session: str, args: list[str], says: str, tmp_path: Path) -> None:
    """The line comes from the check nox runs first, not from an install that fails:
    without an environment (--no-venv) any install would be refused with another line."""
    cpu_torch = tmp_path / "site" / "torch"
    cpu_torch.mkdir(parents=True)
    (cpu_torch / "__init__.py").write_text(
        "__version__ = '2.13.0+cpu'\nclass version:\n    cuda = None\n")
    code, lines, seconds = _nox("--no-venv", "--envdir", str(tmp_path), "-s", session,
                                "--", *args, env={"PYTHONPATH": str(tmp_path / "site"),
                                                  "PATH": str(tmp_path)})
    assert code != 0
    assert lines[-1].startswith(f"nox > Session {session} aborted: "), lines
    assert says in lines[-1]
    assert [line for line in lines if not line.startswith("nox > ")] == []
    assert not [line for line in lines if "install" in line.lower()
                and not line.startswith(f"nox > Session {session} aborted")], lines
    assert seconds < 10


def _required(command: tuple[str, ...]) -> list[str]:
    """What the verb's own parser requires, as a user types it (``--out``, ``STACK``)."""
    import argparse

    from sm120fork.doctor.cli import parser as doctor_parser

    parser = doctor_parser() if command == ("doctor",) else make_parser([command[0]])
    for word in command if command != ("doctor",) else ():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return [max(a.option_strings, key=len) if a.option_strings
            else str(a.metavar or a.dest).upper()
            for a in parser._actions if a.required]


def test_nox_list_reads_as_a_menu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`nox -l` shows no note meant for the noxfile's maintainers; each session's line says
    what it needs of the machine and names every argument its verb requires."""
    code, lines, _ = _nox("-l")
    assert code == 0
    text = "\n".join(lines)
    assert "thin" not in text
    assert "front door" not in text.lower()
    menu = {line.split()[1]: line for line in lines if line[:2] in ("* ", "- ")}
    nf = _noxfile()
    assert set(menu) == {name for name, value in vars(nf).items()
                         if callable(getattr(value, "func", None)) and hasattr(value, "python")}
    commands: dict[str, tuple[str, ...]] = {}
    for name, line in menu.items():
        assert "any machine" in line or "needs " in line, line
        session = _Recorder([])
        session.name = name  # type: ignore[attr-defined]
        seen: list[tuple[str, ...]] = []
        monkeypatch.setattr(nf, "ready", lambda _s, *command, seen=seen: seen.append(command))
        getattr(nf, name).func(session)
        if seen and seen[0] != ("cibuildwheel",):
            commands[name] = seen[0]
    assert {"build", "status", "bump", "refresh", "upstream-pr", "verify-sm120", "gpu",
            "doctor", "tune", "gpu-kit", "record", "index", "watch"} \
        <= {command[0] for command in commands.values()} <= set(VERBS)
    for name, command in commands.items():
        for argument in _required(command):
            assert f" {argument}" in menu[name], (name, argument)
    for needs, sessions in (("needs GPUs", ("gpu_test", "bench", "sglang_layer", "tune")),
                            ("needs nvcc", ("verify_sm120",)),
                            ("needs docker or podman", ("cibuildwheel",))):
        for name in sessions:
            assert needs in menu[name], name
