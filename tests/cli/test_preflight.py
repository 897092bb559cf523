"""The noxfile's preflight: a session's arguments read by its verb's own parser, and the
machine asked for what the verb needs, before anything is installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.cli.preflight import check, container_engine
from sm120fork.errors import ConfigError, NoGpuError, UsageError

SRC = Path(__file__).resolve().parents[2] / "src"

#: What each session runs, with arguments its verb accepts.
SESSIONS = {
    "build": (("build",), []), "index": (("index",), ["--url", "https://x"]),
    "status": (("status",), ["--json"]), "watch": (("watch",), ["--limit", "1"]),
    "bump": (("bump",), ["s", "p", "1.0"]), "refresh": (("refresh",), ["s", "p"]),
    "upstream_pr": (("upstream-pr",), ["s"]), "verify_sm120": (("verify-sm120",), []),
    "build_aot": (("build-aot",), []), "gpu_kit": (("gpu-kit",), ["--python", "3.12",
                                                                  "--out", "kit"]),
    "record_import": (("record", "import"), ["runs"]), "doctor": (("doctor",), ["--tp", "2"]),
    "gpu_test": (("gpu", "test"), ["--quick"]), "bench": (("gpu", "bench"), []),
    "sglang_layer": (("gpu", "sglang-layer"), ["--stack", "s", "--out", "o"]),
    "tune": (("tune",), ["--stack", "s"]), "cibuildwheel": (("cibuildwheel",), []),
}


@pytest.fixture(autouse=True)
def _outside_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where no forks/ declares stacks, so the stack names above ("s") are the
    verbs' business; the test of that check makes its own forks/."""
    monkeypatch.chdir(tmp_path)


def test_the_preflight_of_every_session_needs_only_the_standard_library() -> None:
    """nox's own Python has none of the toolkit's dependencies: with the site packages
    off (python -S), each session's check parses its arguments and asks the machine, and
    ends in the toolkit's own error or none, never in an ImportError."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import json\n"
        "from sm120fork.cli.preflight import check\n"
        "from sm120fork.errors import ToolkitError\n"
        "for name, (command, args) in json.loads(sys.argv[2]).items():\n"
        "    try:\n"
        "        check(name, command, args)\n"
        "    except ToolkitError as exc:\n"
        "        print(name, type(exc).__name__)\n")
    import json

    done = subprocess.run([sys.executable, "-S", "-I", "-c", script, str(SRC),
                           json.dumps(SESSIONS)], capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    refused = dict(line.split() for line in done.stdout.splitlines())
    # No torch without the site packages: every GPU session says so, nothing else fails
    # for want of a package (nvcc and docker are this machine's business).
    assert {refused.get(n) for n in ("gpu_test", "bench", "sglang_layer", "tune")} == \
        {"NoGpuError"}
    assert set(refused) <= {"gpu_test", "bench", "sglang_layer", "tune", "verify_sm120",
                            "cibuildwheel"}, refused


@pytest.mark.parametrize(("session", "command", "args", "says"), [
    ("sglang_layer", ("gpu", "sglang-layer"), [], "required: --out"),
    ("tune", ("tune",), [], "required: --stack"),
    ("gpu_kit", ("gpu-kit",), ["--out", "k"], "required: --python"),
    ("bump", ("bump",), ["only-a-stack"], "required: project"),
    ("build", ("build",), ["--stak", "x"], "unrecognized arguments: --stak"),
    ("doctor", ("doctor",), ["--tp", "two"], "invalid int value: 'two'"),
    ("watch", ("watch",), ["--limit", "0"], "0 is not a positive number"),
])
def test_a_wrong_argument_is_refused_by_the_verbs_parser_naming_the_session(
        session: str, command: tuple[str, ...], args: list[str], says: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError) as caught:
        check(session, command, args)
    assert says in caught.value.message
    assert caught.value.where == f"nox -s {session}"
    assert caught.value.fix == f"see nox -s {session} -- --help"
    assert capsys.readouterr().err == ""  # the usage text is not printed: one line


def test_a_stack_forks_does_not_declare_is_refused_before_the_installs(
        tmp_path: Path) -> None:
    """nox -s build -- --stack nope said so after 49 s of installs, bump after 96 s."""
    (tmp_path / "forks").mkdir()
    for name in ("sglang-0.5.10", "sglang-0.5.23"):
        (tmp_path / "forks" / f"{name}.toml").write_text("")
    for session, command, args in [
            ("build", ("build",), ["--stack", "nope"]),
            ("bump", ("bump",), ["nope", "sglang", "1.0"]),
            ("status", ("status",), ["nope"]),
            ("watch", ("watch",), ["--stack", "sglang-0.5.10", "--stack", "nope"]),
            ("tune", ("tune",), ["--stack", "nope"]),  # before the GPU check
            ("sglang_layer", ("gpu", "sglang-layer"), ["--stack", "nope", "--out", "o"])]:
        with pytest.raises(ConfigError) as caught:
            check(session, command, args)
        assert caught.value.message == \
            "forks/: unknown stack 'nope' (choose one of: sglang-0.5.10, sglang-0.5.23)"
    with pytest.raises(ConfigError, match=r"did you mean 'sglang-0.5.10'\?"):
        check("verify_sm120", ("verify-sm120",), ["--stack", "sglang-0.5.1"])
    check("build", ("build",), ["--stack", "sglang-0.5.23"])
    check("refresh", ("refresh",), ["sglang-0.5.10", "sglang"])
    # A stopped bump's stack is its saved state's (a --new-stack one is not declared yet).
    check("bump", ("bump",), ["sglang-0.6", "sglang", "--continue"])


def test_a_project_its_stack_does_not_declare_is_refused_before_the_installs(
        tmp_path: Path) -> None:
    (tmp_path / "forks").mkdir()
    (tmp_path / "forks" / "s.toml").write_text("[projects.sglang]\n[projects.flashinfer]\n")
    for session, command, args in [("bump", ("bump",), ["s", "sglangg", "1.0"]),
                                   ("refresh", ("refresh",), ["s", "sglangg"]),
                                   ("upstream_pr", ("upstream-pr",), ["s", "sglangg"])]:
        with pytest.raises(ConfigError) as caught:
            check(session, command, args)
        assert caught.value.message == ("forks/s.toml: unknown project 'sglangg' (did you "
                                        "mean 'sglang'?)")
    with pytest.raises(ConfigError, match="choose one of: sglang, flashinfer"):
        check("refresh", ("refresh",), ["s", "torch"])
    check("refresh", ("refresh",), ["s", "flashinfer"])
    check("upstream_pr", ("upstream-pr",), ["s"])


def test_a_bump_without_a_version_is_refused_before_the_installs() -> None:
    """It was answered by the verb, after 89 s of installs."""
    with pytest.raises(UsageError) as caught:
        check("bump", ("bump",), ["s", "sglang"])
    assert caught.value.message == ("nox -s bump: bump needs a version or a git SHA (or "
                                    "--continue / --abort) (see nox -s bump -- --help)")
    for resumed in ("--continue", "--skip", "--abort"):
        check("bump", ("bump",), ["s", "sglang", resumed])


def test_a_python_the_doctor_cannot_find_is_refused_before_the_installs() -> None:
    """nox -s doctor -- --python /nope answered after 8-17 s of installing the toolkit."""
    with pytest.raises(UsageError, match="--python /no/such/python: no such interpreter"):
        check("doctor", ("doctor",), ["--python", "/no/such/python", "--tp", "2"])
    check("doctor", ("doctor",), ["--python", sys.executable])


def test_a_kit_of_a_stack_never_built_is_refused_before_the_installs(tmp_path: Path) -> None:
    """On a fresh clone nox -s gpu_kit -- --python 3.12 --out K said so after 8 s."""
    (tmp_path / "forks").mkdir()
    (tmp_path / "forks" / "a.toml").write_text("[stack]\ndefault = false\n")
    (tmp_path / "forks" / "b.toml").write_text("[stack]\ndefault = true\n")
    kit = ["--python", "3.12", "--out", "k"]
    for stack, args in (("b", kit), ("a", [*kit, "--stack", "a"])):
        with pytest.raises(ConfigError) as caught:
            check("gpu_kit", ("gpu-kit",), args)
        assert caught.value.message == (f"stack {stack} has no build in wheels/{stack} "
                                        f"(nox -s build -- --stack {stack})")
    (tmp_path / "wheels" / "b").mkdir(parents=True)
    (tmp_path / "wheels" / "b" / "manifest.json").write_text("{}")
    check("gpu_kit", ("gpu-kit",), kit)


def test_asking_for_help_is_never_refused() -> None:
    check("sglang_layer", ("gpu", "sglang-layer"), ["--help"])
    check("tune", ("tune",), ["-h"])


def test_a_gpu_session_asks_the_gpu_check_the_verb_runs_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sm120fork.gpu.core import safety as preflight

    def no_gpu() -> None:
        raise NoGpuError("no torch here")

    monkeypatch.setattr(preflight, "require_gpu", no_gpu)
    for name, (command, args) in SESSIONS.items():
        if name in ("gpu_test", "bench", "sglang_layer", "tune"):
            with pytest.raises(NoGpuError):
                check(name, command, args)
    # On the CPU device the layer harness needs no GPU; its own one-of check still holds.
    check("sglang_layer", ("gpu", "sglang-layer"),
          ["--device", "cpu", "--stack", "s", "--out", "o"])
    with pytest.raises(UsageError, match="one of --stack, --stack-dir, --sglang-path"):
        check("sglang_layer", ("gpu", "sglang-layer"), ["--out", "o"])


def test_verify_sm120_needs_nvcc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    with pytest.raises(ConfigError, match="CUDA_HOME has no bin/nvcc"):
        check("verify_sm120", ("verify-sm120",), [])


def _engine(tmp_path: Path, name: str, exit_code: int) -> str:
    tool = tmp_path / name
    tool.write_text(f"#!/bin/sh\necho 'Cannot connect to the {name} daemon' >&2\n"
                    f"exit {exit_code}\n")
    tool.chmod(0o755)
    return str(tool)


def test_cibuildwheel_needs_a_container_engine_that_answers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither docker nor podman is on PATH") as caught:
        container_engine({}, lambda _: None)
    assert "nox -s build_aot" in caught.value.message
    podman = _engine(tmp_path, "podman", 0)
    with pytest.raises(ConfigError) as caught:
        container_engine({}, {"podman": podman}.get)
    assert caught.value.fix == "CIBW_CONTAINER_ENGINE=podman nox -s cibuildwheel"
    assert container_engine({"CIBW_CONTAINER_ENGINE": "podman"}, {"podman": podman}.get) \
        == "podman"
    docker = _engine(tmp_path, "docker", 1)
    with pytest.raises(ConfigError, match="`docker info` failed: Cannot connect to the "
                                          "docker daemon"):
        container_engine({}, {"docker": docker}.get)
