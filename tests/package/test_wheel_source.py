"""The ``wheel`` source kind and projects used as published, on small scenario wheels.

The wheels are made here (``wheel pack`` of a folder: no network): demo-app 0.9.0 for
cp311 and cp312 with a compiled extension, and demo-lib 1.2.3 (py3-none-any, with an
extra ``cu13``), which demo-app requires as ``demo-lib[cu13]==1.2.3``.
"""

from __future__ import annotations

import email.parser
import json
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from installer.sources import WheelFile

from sm120fork.errors import BuildError, ChecksumError, ConfigError, PatchError
from sm120fork.package.stack import build_stack
from sm120fork.util.files import sha256_file
from sm120fork.workspace import Workspace

from conftest import git, make_patch, write_series

STACK = "wdemo"
APP_SOURCES = {
    "demo_app/__init__.py": "def supported_majors():\n    return [9, 10]\n",
    "demo_app/gate.py": "def allowed(major):\n    return major in (9, 10)\n",
    "demo_app/data/table.json": '{"rows": [1, 2, 3]}\n',
}


@dataclass
class WheelScenario:
    ws: Workspace
    app_repo: Path
    app_wheels: list[Path]
    lib_wheel: Path
    app_series: Path


def _pack(tmp: Path, name: str, version: str, tag: str, files: dict[str, bytes],
          requires: list[str], extras: list[str], purelib: bool) -> Path:
    pkg = name.replace("-", "_")
    root = tmp / f"src-{pkg}-{tag}" / f"{pkg}-{version}"
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if rel.endswith(".so"):
            path.chmod(0o755)
    info = root / f"{pkg}-{version}.dist-info"
    info.mkdir()
    meta = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}",
            *(f"Requires-Dist: {r}" for r in requires),
            *(f"Provides-Extra: {e}" for e in extras)]
    (info / "METADATA").write_text("\n".join(meta) + "\n\nThe long description.\n")
    (info / "WHEEL").write_text(
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {str(purelib).lower()}\n"
        f"Tag: {tag}\n")
    (info / "top_level.txt").write_text(pkg + "\n")
    out = tmp / "dist"
    out.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "wheel", "pack", "--dest-dir", str(out), str(root)],
                   check=True, capture_output=True, env={"SOURCE_DATE_EPOCH": "1700000000"})
    (wheel,) = out.glob(f"{pkg}-{version}-{tag}.whl")
    return wheel


def _toml(app_wheels: list[Path], lib_wheel: Path, *, lib_version: str = "1.2.3",
          requires: str = "demo-lib[cu13]==1.2.3") -> str:
    def pins(key: str, wheels: list[Path]) -> str:
        return "".join(textwrap.dedent(f"""
            [[projects.{key}.wheels]]
            filename = "{w.name}"
            sha256 = "{sha256_file(w)}"
            url = "{w.as_uri()}"
            """) for w in wheels)

    return textwrap.dedent(f"""
        [stack]
        name = "{STACK}"
        default = true

        [projects.lib]
        distribution = "demo-lib"
        version = "{lib_version}"
        local_label = "sm120.1"
        package_root = "."
        series = "patches/{STACK}/lib"
        source = "wheel"

        [projects.app]
        distribution = "demo-app"
        version = "0.9.0"
        local_label = "sm120.1"
        package_root = "python"
        series = "patches/{STACK}/app"
        source = "wheel"
        requires = ["lib"]
        upstream_requires = ["{requires}"]
        """) + pins("lib", [lib_wheel]) + pins("app", app_wheels)


@pytest.fixture
def scenario(tmp_path: Path) -> WheelScenario:
    made = tmp_path / "made"
    app_wheels = []
    for py in ("311", "312"):
        files = {rel: text.encode() for rel, text in APP_SOURCES.items()}
        files[f"demo_app/_ext.cpython-{py}-x86_64-linux-gnu.so"] = b"\x7fELF" + bytes(range(256))
        app_wheels.append(_pack(made, "demo-app", "0.9.0", f"cp{py}-cp{py}-manylinux_2_34_x86_64",
                                files, ["demo-lib[cu13]==1.2.3"], [], purelib=False))
    lib_wheel = _pack(made, "demo-lib", "1.2.3", "py3-none-any",
                      {"demo_lib/__init__.py": b"VERSION = '1.2.3'\n"}, [], ["cu13"],
                      purelib=True)
    # The upstream repository as the series author sees it (package under python/).
    repo = tmp_path / "app-repo"
    for rel, text in APP_SOURCES.items():
        path = repo / "python" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release 0.9.0")
    root = tmp_path / "toolkit"
    (root / "forks").mkdir(parents=True)
    (root / "forks" / f"{STACK}.toml").write_text(_toml(app_wheels, lib_wheel))
    write_series(root / "patches" / STACK / "lib", [])
    series = root / "patches" / STACK / "app"
    patch = make_patch(repo, series, "G1 gate: allow 12", {
        "python/demo_app/gate.py": ("(9, 10)", "(9, 10, 12)  # sm12x")},
        "python/demo_app/gate.py: (9, 10, 12)  # sm12x")
    write_series(series, [patch.name])
    return WheelScenario(ws=Workspace(root), app_repo=repo, app_wheels=app_wheels,
                         lib_wheel=lib_wheel, app_series=series)


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}


def _modes(wheel: Path) -> dict[str, int]:
    with zipfile.ZipFile(wheel) as zf:
        return {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}


def test_repacked_wheels_differ_only_where_the_series_and_the_label_say(
        scenario: WheelScenario) -> None:
    builds = build_stack(scenario.ws, scenario.ws.stack(STACK))
    apps = [b for b in builds if b.project == "app"]
    assert [b.wheel.name for b in apps] == [
        "demo_app-0.9.0+sm120.1-cp311-cp311-manylinux_2_34_x86_64.whl",
        "demo_app-0.9.0+sm120.1-cp312-cp312-manylinux_2_34_x86_64.whl"]
    for original, build in zip(scenario.app_wheels, apps, strict=True):
        old, new = _members(original), _members(build.wheel)
        old_info, new_info = "demo_app-0.9.0.dist-info", "demo_app-0.9.0+sm120.1.dist-info"
        renamed = {n.replace(old_info, new_info): data for n, data in old.items()}
        assert set(renamed) == set(new)
        differ = sorted(n for n in new if new[n] != renamed[n])
        assert differ == sorted(["demo_app/gate.py", f"{new_info}/METADATA",
                                 f"{new_info}/RECORD"])
        assert new["demo_app/gate.py"] == (
            b"def allowed(major):\n    return major in (9, 10, 12)  # sm12x\n")
        assert new[f"{new_info}/WHEEL"] == old[f"{old_info}/WHEEL"]
        parse = email.parser.BytesParser().parsebytes
        old_meta, new_meta = parse(old[f"{old_info}/METADATA"]), parse(new[f"{new_info}/METADATA"])
        assert new_meta["Version"] == "0.9.0+sm120.1"
        assert sorted((k, v) for k, v in old_meta.items() if k != "Version") == sorted(
            (k, v) for k, v in new_meta.items() if k != "Version")
        assert new_meta.get_payload() == old_meta.get_payload()
        so = next(n for n in new if n.endswith(".so"))
        assert _modes(build.wheel)[so] & 0o111  # executable bit kept
        with WheelFile.open(build.wheel) as wf:
            wf.validate_record()  # RECORD lists every file with its correct hash
        entry = build.entry
        assert entry.used_as_published is False
        assert entry.source.filename == original.name
        assert entry.source.digest == sha256_file(original)
        assert entry.changed_files == ("demo_app/gate.py",)
        assert [r.passed for r in entry.artifact_check] == [True]


def test_empty_series_ships_the_published_wheel(scenario: WheelScenario) -> None:
    builds = build_stack(scenario.ws, scenario.ws.stack(STACK))
    (lib,) = [b for b in builds if b.project == "lib"]
    assert lib.wheel.name == scenario.lib_wheel.name
    assert lib.sha256 == sha256_file(scenario.lib_wheel) == lib.entry.sha256
    assert lib.version == "1.2.3"
    assert lib.entry.used_as_published is True
    out = scenario.ws.stack_wheels(STACK)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(w["project"], w["used_as_published"]) for w in manifest["wheels"]] == [
        ("lib", True), ("app", False), ("app", False)]
    assert (out / "constraints.txt").read_text().splitlines()[1:] == [
        "demo-lib==1.2.3", "demo-app==0.9.0+sm120.1"]
    assert not (scenario.ws.work_tree(scenario.ws.stack(STACK),
                                      scenario.ws.stack(STACK).project("lib"))).exists()
    again = build_stack(scenario.ws, scenario.ws.stack(STACK))
    assert all(b.cached for b in again)


def test_published_wheel_is_sha256_checked(scenario: WheelScenario) -> None:
    toml = scenario.ws.forks_dir / f"{STACK}.toml"
    good = sha256_file(scenario.lib_wheel)
    toml.write_text(toml.read_text().replace(good, "0" * 64))
    with pytest.raises(ChecksumError, match=r"sha256 mismatch for demo_lib-1\.2\.3"):
        build_stack(scenario.ws, scenario.ws.stack(STACK))


def _replace_series(scenario: WheelScenario, edits: dict[str, tuple[str, str]],
                    fingerprint: str) -> None:
    for old in scenario.app_series.glob("*.patch"):
        old.unlink()
    git(scenario.app_repo, "checkout", "-q", "main")
    git(scenario.app_repo, "branch", "-q", "-D", "scratch")
    patch = make_patch(scenario.app_repo, scenario.app_series, "G9 bad", edits, fingerprint)
    write_series(scenario.app_series, [patch.name])


def test_series_touching_a_file_the_wheel_lacks_is_refused(scenario: WheelScenario) -> None:
    _replace_series(scenario, {"python/demo_app/new.txt": ("", "X = 1  # sm12x\n")},
                    "python/demo_app/new.txt: X = 1  # sm12x")
    with pytest.raises(PatchError, match=r"python/demo_app/new.txt, which demo_app-0.9.0-cp311"):
        build_stack(scenario.ws, scenario.ws.stack(STACK))
    assert not scenario.ws.stack_wheels(STACK).exists()


def test_a_module_the_series_adds_ships_in_every_wheel(scenario: WheelScenario) -> None:
    """A fork-only module (0.5.23's G7 adds its policy reader) is packed into the wheels."""
    _replace_series(scenario, {"python/demo_app/new.py": ("", "X = 1  # sm12x\n")},
                    "python/demo_app/new.py: X = 1  # sm12x")
    build_stack(scenario.ws, scenario.ws.stack(STACK))
    wheels = sorted(scenario.ws.stack_wheels(STACK).glob("demo_app-*.whl"))
    assert wheels
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            assert zf.read("demo_app/new.py") == b"X = 1  # sm12x\n"
            assert any(n.endswith("RECORD") and b"demo_app/new.py," in zf.read(n)
                       for n in zf.namelist())


def test_series_touching_a_compiled_file_is_refused(scenario: WheelScenario) -> None:
    so = "python/demo_app/_ext.cpython-311-x86_64-linux-gnu.so"
    git(scenario.app_repo, "checkout", "-q", "main")
    (scenario.app_repo / so).write_text("not really compiled\n")
    git(scenario.app_repo, "add", "-A")
    git(scenario.app_repo, "commit", "-q", "-m", "pretend the repo had it")
    _replace_series(scenario, {so: ("not really", "patched")}, f"{so}: patched")
    with pytest.raises(PatchError, match=r"compiled file python/demo_app/_ext"):
        build_stack(scenario.ws, scenario.ws.stack(STACK))


def test_wheels_with_different_preimages_are_refused(scenario: WheelScenario,
                                                     tmp_path: Path) -> None:
    files = {rel: text.encode() for rel, text in APP_SOURCES.items()}
    files["demo_app/gate.py"] = b"def allowed(major):\n    return major in (9, 10)  # other\n"
    other = _pack(tmp_path / "other", "demo-app", "0.9.0", "cp312-cp312-manylinux_2_34_x86_64",
                  files, ["demo-lib[cu13]==1.2.3"], [], purelib=False)
    toml = scenario.ws.forks_dir / f"{STACK}.toml"
    text = toml.read_text()
    old = scenario.app_wheels[1]
    toml.write_text(text.replace(sha256_file(old), sha256_file(other))
                    .replace(old.as_uri(), other.as_uri()))
    with pytest.raises(PatchError, match=r"ships another demo_app/gate\.py"):
        build_stack(scenario.ws, scenario.ws.stack(STACK))


def test_mismatched_pins_are_refused_when_the_stack_loads(scenario: WheelScenario) -> None:
    toml = scenario.ws.forks_dir / f"{STACK}.toml"
    toml.write_text(_toml(scenario.app_wheels, scenario.lib_wheel,
                          requires="demo-lib[cu13]==1.3.0"))
    with pytest.raises(ConfigError) as err:
        scenario.ws.stack(STACK)
    message = str(err.value)
    assert "projects.app.upstream_requires[0]" in message
    assert "demo-app 0.9.0 requires demo-lib[cu13]==1.3.0" in message
    assert "the stack's pin demo-lib 1.2.3 (projects.lib.version) does not satisfy" in message
    # A marker that never holds on Linux does not constrain the stack.
    toml.write_text(_toml(scenario.app_wheels, scenario.lib_wheel,
                          requires='demo-lib==1.3.0; sys_platform == \\"darwin\\"'))
    assert scenario.ws.stack(STACK).project("app").upstream_requires


def test_missing_extra_and_undeclared_requirement_are_refused(scenario: WheelScenario) -> None:
    toml = scenario.ws.forks_dir / f"{STACK}.toml"
    toml.write_text(_toml(scenario.app_wheels, scenario.lib_wheel,
                          requires="demo-lib[cu12]==1.2.3"))
    with pytest.raises(BuildError, match=r"requires demo-lib\[cu13\]==1.2.3, which projects.app"):
        build_stack(scenario.ws, scenario.ws.stack(STACK))
    bare = _pack(scenario.ws.root.parent / "bare", "demo-lib", "1.2.3", "py3-none-any",
                 {"demo_lib/__init__.py": b"VERSION = '1.2.3'\n"}, [], [], purelib=True)
    toml.write_text(_toml(scenario.app_wheels, bare))
    with pytest.raises(BuildError, match=r"the stack's pin demo-lib 1.2.3 .* no extra cu13"):
        build_stack(scenario.ws, scenario.ws.stack(STACK))


def test_a_wheel_tree_left_by_a_killed_run_is_scratch_the_next_run_removes(
        scenario: WheelScenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheel kind stages its fork tree like the sdist kind: in a folder named for the
    process, so what a SIGKILL leaves (no ``finally`` ran) is removed by the next run."""
    import os
    import shutil

    from sm120fork.fetch.kinds import PUBLISHED
    from sm120fork.util.files import remove_stale_scratch
    from sm120fork.util.git import Git

    gone = subprocess.Popen(["true"])
    gone.wait()
    stack = scenario.ws.stack(STACK)
    work = scenario.ws.work_tree(stack, stack.project("app"))
    work.parent.mkdir(parents=True, exist_ok=True)

    def killed(_repo_dir: Path) -> None:
        raise KeyboardInterrupt("killed here")

    with monkeypatch.context() as m:  # a process that dies mid-way: no cleanup runs
        m.setattr(os, "getpid", lambda: gone.pid)
        m.setattr(shutil, "rmtree", lambda *a, **k: None)
        m.setattr(Git, "init", killed)
        with pytest.raises(KeyboardInterrupt):
            PUBLISHED.init_tree(stack.project("app"), work, scenario.ws)
    (left,) = list(work.parent.iterdir())
    assert [p.name for p in left.rglob("gate.py")] == ["gate.py"]  # the half-made tree
    assert remove_stale_scratch(work.parent) == [left]
    assert not left.exists()
    assert not work.exists()
