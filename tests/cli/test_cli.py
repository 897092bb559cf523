"""The one command line: every verb listed explicitly, the GPU verbs included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sm120fork.cli import main as cli_main
from sm120fork.cli.main import VERBS, main, make_parser


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_shows_its_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each verb's module imports and adds its arguments (loaded only for that verb)."""
    with pytest.raises(SystemExit) as exited:
        main([verb, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    assert ("--json" if verb == "doctor" else VERBS[verb].help.split()[0]) in out


def test_gpu_verbs_through_the_toolkit_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m sm120fork gpu test`` is the same command as ``python -m sm120fork.gpu``:
    it refuses multicast backends with the config exit code, before touching anything."""
    rc = main(["gpu", "test", "--quick", "--backend", "auto", "--work-dir", str(tmp_path)])
    assert rc == 2
    assert "multicast" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_gpu_verb_gets_its_own_arguments_after_global_options() -> None:
    assert cli_main._verb_argv(["--root", "gpu", "-q", "gpu", "bench", "--quick"]) == [
        "bench", "--quick"]


def test_gpu_module_needs_no_rich() -> None:
    """The GPU machines run ``python -m sm120fork.gpu`` without the toolkit's CLI deps."""
    code = ("import sys; sys.modules['rich'] = None; sys.argv = ['x', '--help']\n"
            "import runpy; runpy.run_module('sm120fork.gpu', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "test" in proc.stdout
    assert "bench" in proc.stdout


def test_doctor_keeps_its_own_arguments_after_global_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert VERBS["doctor"].own_main is not None
    with pytest.raises(SystemExit) as exited:
        main(["-q", "doctor", "--help"])
    assert exited.value.code == 0
    assert "--json" in capsys.readouterr().out


def test_usage_errors_have_their_own_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    from sm120fork.errors import ConfigError, UsageError
    from sm120fork.gpu import cli as gpu

    assert UsageError.exit_code != ConfigError.exit_code
    assert main(["build", "--no-such-option"]) == UsageError.exit_code
    assert "usage: python -m sm120fork" in capsys.readouterr().err
    assert gpu.main(["test", "--world-sizes", "1"]) == UsageError.exit_code
    assert "world sizes must be >= 2" in capsys.readouterr().err


def test_verbosity_options_work_after_the_verb_as_nox_passes_them() -> None:
    """``nox -s build -- -q`` runs ``python -m sm120fork build -q``."""
    parser = make_parser()
    assert parser.parse_args(["build", "-q"]).quiet
    assert parser.parse_args(["-q", "build"]).quiet
    assert parser.parse_args(["status", "-v"]).verbose
    assert not parser.parse_args(["status"]).verbose


def test_the_live_stage_line_shows_what_each_project_is_doing() -> None:
    import io

    from rich.console import Console

    from sm120fork.cli.build import StageLine

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    with StageLine(console) as stage:
        stage("flashinfer", "building: copying flashinfer/comm.py")
        stage("sglang", "checking the wheel")
        stage("flashinfer", "building: " + "x" * 200)
        stage.progress.refresh()
        shown = out.getvalue()
    assert "flashinfer: building: copying flashinfer/comm.py" in shown
    assert "sglang: checking the wheel" in shown
    assert "x" * 70 not in shown  # a long line is cut to the terminal's width
    assert "…" in shown


def test_log_lines_and_hints_are_never_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe or a log file is 80 columns to rich: a long command must still be one line."""
    import io
    import logging

    from rich.console import Console

    from sm120fork.cli.output import LineHandler
    from sm120fork.util.hint import command

    out = io.StringIO()
    handler = LineHandler(Console(file=out, width=80, force_terminal=False))
    url = "https://files.pythonhosted.org/packages/ad/7e/" + "a" * 60 + "/x-1.0.tar.gz"
    handler.emit(logging.LogRecord("sm120fork", logging.INFO, __file__, 1, "downloading %s",
                                   (url,), None))
    assert out.getvalue() == f"INFO     downloading {url}\n"
    monkeypatch.delenv("SM120FORK_FRONT_DOOR", raising=False)
    assert command("bump", "s", "p", "--skip") == "python -m sm120fork bump s p --skip"
    assert command("gpu test", "--quick") == "python -m sm120fork gpu test --quick"
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", "nox")
    assert command("bump", "s", "p", "--skip") == "nox -s bump -- s p --skip"
    assert command("upstream-pr", "s", "p") == "nox -s upstream_pr -- s p"
    assert command("gpu bench") == "nox -s bench"


def test_the_build_summary_lists_the_plugin_wheel_beside_the_projects(tmp_path: Path) -> None:
    import json
    from types import SimpleNamespace
    from typing import cast

    from rich.console import Console

    from sm120fork.cli.build import summary_table
    from sm120fork.declare import Stack
    from sm120fork.manifest import ManifestEntry
    from sm120fork.package.publish import ProjectBuild

    out = tmp_path / "wheels" / "s"
    (out / "plugin").mkdir(parents=True)
    (out / "plugin" / "plugin.json").write_text(json.dumps({
        "wheel": "sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl", "sha256": "ab" * 32,
        "sglang": "0.5.23", "hooks": [{}] * 5}))
    build = ProjectBuild(project="sglang", distribution="sglang", upstream_version="0.5.23",
                         version="0.5.23+sm120.1", wheel=out / "sglang-0.5.23+sm120.1.whl",
                         sha256="cd" * 32, cached=True, seconds=0.0,
                         entry=cast(ManifestEntry, SimpleNamespace(
                             patches=(None,) * 5, used_as_published=False)))
    console = Console(width=200, record=True, color_system=None)
    console.print(summary_table(cast(Stack, SimpleNamespace(name="s")), out, [build]))
    rows = [line for line in console.export_text().splitlines() if "│" in line]
    assert any(" sglang " in r and "cached" in r for r in rows)
    (plugin,) = [r for r in rows if " plugin " in r]
    assert "plugin/sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl" in plugin
    assert "5 hooks" in plugin
    assert "abababababab" in plugin
