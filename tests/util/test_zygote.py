"""tests/zygote.py: a child forked by the pre-import server behaves as a fresh interpreter
where the toolkit's probes and ranks can tell (argv, sys.path, flags, environment, working
directory, streams, exit status, signals), and dies with its caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_sglang import Sites, zpython

SHOW = ("import json, os, sys; print(json.dumps([sys.argv, sys.path, str(sys.flags), "
        "os.getcwd(), os.environ.get('ZYGOTE_TEST'), sys.stdin.read()]))")


@pytest.fixture(scope="module")
def zpy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zpython(tmp_path_factory.mktemp("zyg"), sys.executable)


def _both(zpy: Path, args: list[str], cwd: Path,
          **env: str) -> list[subprocess.CompletedProcess[str]]:
    full = {**os.environ, "PYTHONPATH": f"{cwd}/a{os.pathsep}{cwd}/b", **env}
    return [subprocess.run([str(python), *args], cwd=cwd, env=full, input="in\n",
                           capture_output=True, text=True, timeout=120, check=False)
            for python in (sys.executable, zpy)]


def test_a_forked_child_sees_what_a_fresh_interpreter_sees(zpy: Path, tmp_path: Path) -> None:
    fresh, forked = _both(zpy, ["-c", SHOW, "x", "--y"], tmp_path, ZYGOTE_TEST="1")
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert '"1"' in forked.stdout
    assert '"in\\n"' in forked.stdout
    module = tmp_path / "mod_under_test.py"
    module.write_text("import sys\nprint(sys.argv[1:], sys.path[0])\nsys.exit(3)\n")
    fresh, forked = _both(zpy, ["-m", "mod_under_test", "z"], tmp_path)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout) == (
        3, f"['z'] {tmp_path}\n")
    fresh, forked = _both(zpy, [str(module), "w"], tmp_path)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)


def test_an_uncaught_error_is_exit_1_with_its_traceback(zpy: Path, tmp_path: Path) -> None:
    fresh, forked = _both(zpy, ["-c", "raise ValueError('boom')"], tmp_path)
    assert forked.returncode == fresh.returncode == 1
    assert forked.stderr.splitlines()[-2:] == fresh.stderr.splitlines()[-2:]


def test_interpreter_options_run_the_real_interpreter(zpy: Path, tmp_path: Path) -> None:
    fresh, forked = _both(zpy, ["-S", "-c", "import sys; print(sys.flags.no_site)"], tmp_path)
    assert forked.stdout == fresh.stdout == "1\n"


def test_sigterm_reaches_the_child_and_a_killed_caller_takes_it_along(
        zpy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    code = (f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(120)")
    for sig, status in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        marker.unlink(missing_ok=True)
        caller = subprocess.Popen([str(zpy), "-c", code], cwd=tmp_path)
        deadline = time.monotonic() + 120
        while not (marker.is_file() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(marker.read_text())
        assert child != caller.pid
        caller.send_signal(sig)
        assert caller.wait(timeout=30) == status
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{child}").exists() or "Z" in Path(
            f"/proc/{child}/stat").read_text().split(")")[1][:3]


def test_the_probes_and_cpu_ranks_go_to_a_prepared_server() -> None:
    """The modules that stub the GPU-only packages first thing; a rank on a real GPU
    imports FlashInfer before, so it goes to a plain server."""
    import json

    import zygote

    for probe in ("communicator", "layer_boundary"):
        assert zygote.preparation(["-m", f"sm120fork.layouts.{probe}",
                                   json.dumps({"capability": [9, 0]})])
    rank = "sm120fork.gpu.layer.rank"
    assert zygote.preparation(["-m", rank, json.dumps({"device": "cpu"})])
    assert not zygote.preparation(["-m", rank, json.dumps({"device": "cuda"})])
    assert not zygote.preparation(["-m", rank, "not json"])
    assert not zygote.preparation(["-m", "json.tool", "{}"])
    assert not zygote.preparation(["-c", "pass"])
    assert zygote.preparation([str(Path(__file__).parents[1] / "plugin" / "plugin_probe.py"),
                               "site", "12.0", "--load-plugins"])
    assert not zygote.preparation(["other_probe.py", "site", "12.0"])


@pytest.mark.network
@pytest.mark.runs_stack("sglang-0.5.10")
def test_a_probe_forked_by_a_prepared_server_observes_what_a_fresh_one_does(
        sglang_0510: Path, sglang_0510_upstream: Path, sites: Sites,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The communicator probe on the patched tree (SM120 with CUDA 12.8) and the
    unpatched one (SM90), and the plugin probe on stock sglang 0.5.23 with the plugin
    loaded (SM120): byte for byte the same output from a fresh interpreter and from a
    child of the prepared server (which did run it: its log names the child)."""
    import json

    import zygote
    from sm120fork.layouts import communicator as checks

    folder = tmp_path_factory.mktemp("zyg-prepared")
    zpy = zpython(folder, sys.executable)
    src = Path(checks.__file__).resolve().parents[2]
    runs = [(tree, {"PYTHONPATH": f"{tree / 'python'}{os.pathsep}{src}"},
             ["-m", checks.PROBE_MODULE, json.dumps(request)], f"-m {checks.PROBE_MODULE}")
            for tree, request in (
                (sglang_0510, {"suite": "decisions", "capability": [12, 0], "cuda": "12.8"}),
                (sglang_0510_upstream, {"suite": "decisions", "capability": [9, 0]}))]
    probe = Path(__file__).resolve().parents[1] / "plugin" / "plugin_probe.py"
    runs.append((folder, {"PYTHONPATH": os.pathsep.join(map(str, (sites.deps, src,
                                                                   sites.plugin)))},
                 [str(probe), str(sites.stock), "12.0", "--load-plugins"], str(probe)))
    for cwd, paths, args, logged in runs:
        env = {**os.environ, **paths, "PYTHONDONTWRITEBYTECODE": "1"}
        fresh, forked = (subprocess.run([str(python), *args], cwd=cwd, env=env,
                                        capture_output=True, text=True, timeout=300,
                                        check=False)
                         for python in (sys.executable, zpy))
        assert fresh.returncode == 0, fresh.stderr[-2000:]
        assert (forked.returncode, forked.stdout) == (0, fresh.stdout)
        assert "RESULT" in fresh.stdout or "PLUGIN-PROBE" in fresh.stdout
        key = zygote._key(sys.executable, env, prepared=True)
        log = (folder / f"{key}.sock.log").read_text()
        assert f"cpu child '{logged[:40]}" in log
