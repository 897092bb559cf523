"""The one error boundary (entry.py) of every entry point, and verbs that import only what
they need."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sm120fork.errors as errors_mod
from sm120fork.entry import boundary, error_line, relative
from sm120fork.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PROBLEMS_FOUND,
    CommandError,
    ToolkitError,
    UsageError,
    VerifyError,
)

SRC = Path(__file__).resolve().parents[2] / "src"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _raise(exc: BaseException) -> int:
    raise exc


def test_every_exit_code_means_one_thing() -> None:
    codes = [cls.exit_code for cls in vars(errors_mod).values()
             if isinstance(cls, type) and issubclass(cls, ToolkitError) and cls is not ToolkitError]
    others = [EXIT_PROBLEMS_FOUND, EXIT_INTERNAL, EXIT_INTERRUPTED]
    assert len(set(codes)) == len(codes)
    assert not set(codes) & {0, *others}
    assert len(set(others)) == len(others)


def test_an_error_is_one_line_unless_at_a_terminal(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    exc = CommandError("git am failed\n  (exit 128)", where=str(tmp_path / ".forks" / "t"),
                       fix="resolve it,\n then --continue", detail=f"{tmp_path}/x: conflict")
    out = io.StringIO()
    code = boundary(lambda: _raise(exc), name="build", root=lambda: tmp_path, stderr=out)
    assert code == CommandError.exit_code
    detail, line = out.getvalue().splitlines()
    assert detail == "x: conflict"
    assert line == "error: .forks/t: git am failed (exit 128) (resolve it, then --continue)"
    tty = _Terminal()
    boundary(lambda: _raise(exc), name="build", root=lambda: tmp_path, stderr=tty)
    assert tty.getvalue().splitlines()[-1].startswith("error: ")  # stdout is piped here
    assert "git am failed (exit 128)" in tty.getvalue()
    monkeypatch.setattr(sys, "stdout", _Terminal())
    tty = _Terminal()
    boundary(lambda: _raise(exc), name="build", root=lambda: tmp_path, stderr=tty)
    assert "git am failed\n  (exit 128)" in tty.getvalue()  # a terminal shows it as written


def test_a_long_error_of_the_command_line_is_one_relative_line(tmp_path: Path) -> None:
    """rich wrapped it at 80 columns and named the absolute path."""
    (tmp_path / "forks").mkdir()
    (tmp_path / "forks" / "demo.toml").write_text(
        '[stack]\nname = "demo"\ndefault = true\n'
        "this_is_a_rather_long_misspelt_key_name_to_make_the_line_wrap_in_rich = 1\n")
    done = subprocess.run([sys.executable, "-m", "sm120fork", "--root", str(tmp_path),
                           "status"], capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=str(SRC)), timeout=120)
    assert done.returncode == errors_mod.ConfigError.exit_code
    assert done.stderr.splitlines()[-1] == (
        "error: forks/demo.toml: stack.this_is_a_rather_long_misspelt_key_name_to_make_the_"
        "line_wrap_in_rich: unknown key (known: name, description, default)")


def test_paths_are_named_relative_to_the_checkout() -> None:
    root = Path("/srv/checkout")
    assert relative("/srv/checkout/wheels/a: bad; run in /srv/checkout.", root) == (
        "wheels/a: bad; run in ..")
    assert relative("/srv/checkout2/x and /srv/checkoutx", root) == (
        "/srv/checkout2/x and /srv/checkoutx")
    assert relative("/srv/checkout/x", None) == "/srv/checkout/x"
    assert error_line(UsageError("bad"), root=None, tty=False) == "error: bad"


def test_a_bug_is_a_traceback_and_its_own_exit_code() -> None:
    out = io.StringIO()
    code = boundary(lambda: _raise(ZeroDivisionError("x")), name="status", stderr=out)
    assert code == EXIT_INTERNAL
    assert "Traceback" in out.getvalue()
    assert "ZeroDivisionError" in out.getvalue()
    assert out.getvalue().rstrip().endswith("(a bug: please report the traceback above)")


def test_ctrl_c_ends_the_running_commands_and_exits_130() -> None:
    out = io.StringIO()
    ended: list[bool] = []

    def end_children() -> int:
        ended.append(True)
        return 2

    code = boundary(lambda: _raise(KeyboardInterrupt()), name="build", stderr=out,
                    on_interrupt=end_children)
    assert code == EXIT_INTERRUPTED
    assert ended == [True]
    assert out.getvalue().startswith("interrupted: build stopped, 2 running command(s) ended")


def test_every_entry_point_runs_in_the_boundary(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error is UsageError's code at each of them; a ToolkitError one line."""
    from sm120fork.cli.main import main
    from sm120fork.doctor.cli import main as doctor_main
    from sm120fork.gpu.cli import main as gpu_main

    assert main(["status", "--no-such-flag"]) == UsageError.exit_code
    assert gpu_main(["test", "--no-such-flag"]) == UsageError.exit_code
    assert doctor_main(["--no-such-flag"]) == UsageError.exit_code
    # usage a verb finds wrong after parsing is a UsageError too, not ConfigError's 2
    assert gpu_main(["report", "--out", str(tmp_path / "r")]) == UsageError.exit_code
    (tmp_path / "forks").mkdir()
    assert main(["--root", str(tmp_path), "bump", "demo", "lib"]) == UsageError.exit_code
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "build", "--all-stacks", "--out", "x"]) == (
        UsageError.exit_code)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: python -m sm120fork build: --out takes one stack")


def test_a_usage_error_under_nox_points_to_the_sessions_help(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run through nox, the toolkit is not on the user's PATH: the usage error names the
    session they ran and its help in that form, not ``python -m sm120fork ... --help``."""
    from sm120fork.cli.main import main

    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")  # the noxfile sets it
    monkeypatch.setenv("NOX_CURRENT_SESSION", "build")  # nox sets it
    assert main(["build", "--no-such-flag"]) == UsageError.exit_code
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("error: nox -s build: unrecognized arguments: --no-such-flag "
                    "(see nox -s build -- --help)")
    assert "python -m" not in last
    monkeypatch.delenv("SM120FORK_FRONT_DOOR")
    assert main(["build", "--no-such-flag"]) == UsageError.exit_code
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "(see python -m sm120fork --help)")


def test_a_failing_layer_case_is_a_verify_failure_not_exit_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sm120fork.gpu import cli
    from sm120fork.gpu.layer import run as layer_run
    from sm120fork.layouts import CaseOutcome

    def failing(case: str, **_: object) -> CaseOutcome:
        return CaseOutcome(case=case, passed=False, hung=True,
                           problems=["rank 1 hung"], ranks=[], seconds=1.0, tails=[])

    monkeypatch.setattr(layer_run, "run_case", failing)
    code = cli.main(["sglang-layer", "--sglang-path", str(tmp_path), "--layout",
                     "communicator", "--out", str(tmp_path / "out"), "--device", "cpu",
                     "--case", "fused"])
    assert code == VerifyError.exit_code
    assert "rank 1 hung" in (tmp_path / "out" / "report.md").read_text()


# --- a verb imports only what it needs -------------------------------------------------
_BLOCK = textwrap.dedent("""
    import importlib.abc, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {"git", "rich"}:
                raise ImportError(f"{name} is not installed on this box (test)")
            return None

    sys.meta_path.insert(0, Refuse())
""")


def _without_git_and_rich(tmp_path: Path, *args: str, timeout: float = 300,
                          ) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_BLOCK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(SRC)]),
               CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=timeout, check=False)


def test_the_blocker_really_blocks(tmp_path: Path) -> None:
    done = _without_git_and_rich(tmp_path, "-c", "import rich")
    assert done.returncode != 0
    assert "not installed on this box" in done.stderr


def test_doctor_runs_without_gitpython_and_rich(tmp_path: Path) -> None:
    """A serving box has neither: the doctor's help and its checks still run (no GPU here:
    blockers, exit 15), as ``python -m sm120fork doctor`` and after global options."""
    helped = _without_git_and_rich(tmp_path, "-m", "sm120fork", "doctor", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--json" in helped.stdout
    helped = _without_git_and_rich(tmp_path, "-m", "sm120fork", "-q", "doctor", "--help")
    assert helped.returncode == 0, helped.stderr
    ran = _without_git_and_rich(tmp_path, "-m", "sm120fork", "doctor", "--json",
                                "--decide-timeout", "30", "--python", sys.executable)
    assert ran.returncode in (0, errors_mod.DoctorError.exit_code), ran.stderr
    assert '"blockers"' in ran.stdout
    assert "not installed on this box" not in ran.stderr


def test_gpu_verbs_run_without_gitpython_and_rich(tmp_path: Path) -> None:
    helped = _without_git_and_rich(tmp_path, "-m", "sm120fork.gpu", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "sglang-layer" in helped.stdout
    helped = _without_git_and_rich(tmp_path, "-m", "sm120fork", "gpu", "test", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--wheel-dir" in helped.stdout
