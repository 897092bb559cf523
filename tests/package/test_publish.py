"""Publishing: each stack into its own folder, replaced as a whole or not at all."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sm120fork import manifest as manifest_file
from sm120fork.errors import BuildError, ConfigError
from sm120fork.manifest import ManifestEntry, SourceRecord
from sm120fork.package import publish as pub
from sm120fork.package.publish import ProjectBuild, folder_routes, index_routes, publish
from sm120fork.plugin.build import PublishedPlugin
from sm120fork.util import files
from sm120fork.workspace import Workspace

from conftest import stack_toml


def _workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "toolkit"
    (root / "forks").mkdir(parents=True)
    for name, default in (("one", True), ("two", False)):
        (root / "forks" / f"{name}.toml").write_text(stack_toml(name, [{
            "key": "lib", "distribution": "demo-lib", "version": "1.0", "commit": "a" * 40,
            "filename": "demo_lib-1.0.tar.gz", "sha256": "b" * 64,
            "url": "https://example.invalid/demo_lib-1.0.tar.gz", "stamp": "v.py"}],
            default=default))
    return Workspace(root)


def _entry(project: str, wheel: str, sha256: str) -> ManifestEntry:
    return ManifestEntry(project=project, distribution=project, upstream_version="1.0",
                         version="1.0", upstream_commit=None, upstream_commit_verified=False,
                         source=SourceRecord(kind="sdist", digest="b" * 64), series="s",
                         series_digest="c" * 64, patches=(), wheel=wheel, sha256=sha256,
                         toolkit_version="0")


def _build(tmp_path: Path, stack: str, version: str) -> ProjectBuild:
    wheel = tmp_path / "built" / stack / version / f"demo_lib-{version}-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(f"{stack} {version}".encode())
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return ProjectBuild(project="lib", distribution="demo-lib", upstream_version="1.0",
                        version=version, wheel=wheel, sha256=digest, cached=False,
                        seconds=0.0, entry=_entry("lib", wheel.name, digest))


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_each_stack_publishes_into_its_own_folder(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    one = publish(ws, ws.stack("one"), [_build(tmp_path, "one", "1.0+a")])
    first = _contents(one)
    two = publish(ws, ws.stack("two"), [_build(tmp_path, "two", "1.0+b")])
    assert one == ws.root / "wheels" / "one"
    assert two == ws.root / "wheels" / "two"
    assert _contents(one) == first  # publishing "two" left "one" alone
    assert sorted(_contents(two)) == ["constraints.txt", "demo_lib-1.0+b-py3-none-any.whl",
                                      "manifest.json"]
    assert (two / "constraints.txt").read_text().splitlines() == [
        "# two: pip install -c wheels/two/constraints.txt wheels/two/*.whl", "demo-lib==1.0+b"]
    manifest = manifest_file.load(ws.stack_wheels("two"))
    assert manifest is not None
    assert manifest.stack == "two"
    assert [w.wheel for w in manifest.wheels] == ["demo_lib-1.0+b-py3-none-any.whl"]
    assert manifest_file.load(ws.stack_wheels("three")) is None


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_a_failed_publish_leaves_the_previous_folder_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool) -> None:
    ws = _workspace(tmp_path)
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    stack = ws.stack("one")
    out = publish(ws, stack, [_build(tmp_path, "one", "1.0+a")])
    before = _contents(out)
    copied: list[Path] = []

    def copy_then_fail(src: Path, dest: Path) -> None:
        if copied:
            raise OSError("disk full")
        copied.append(dest)
        files.atomic_copy(src, dest)

    monkeypatch.setattr(pub, "atomic_copy", copy_then_fail)
    two_wheels = [_build(tmp_path, "one", "1.0+b"), _build(tmp_path, "one", "1.0+c")]
    with pytest.raises(OSError, match="disk full"):
        publish(ws, stack, two_wheels)
    assert _contents(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["one"]  # no staging left
    monkeypatch.setattr(pub, "atomic_copy", files.atomic_copy)
    publish(ws, stack, two_wheels)
    assert sorted(_contents(out)) == ["constraints.txt", "demo_lib-1.0+b-py3-none-any.whl",
                                      "demo_lib-1.0+c-py3-none-any.whl", "manifest.json"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["one"]


def test_staging_left_by_a_killed_run_is_removed_by_the_next(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    killed = files.scratch_prefix("one").replace(f"-{os.getpid()}-", f"-{gone.pid}-", 1)
    leftover = ws.root / "wheels" / killed
    leftover.mkdir(parents=True)
    (leftover / "half.whl").write_bytes(b"x")
    other = ws.root / "wheels" / files.scratch_prefix("two")
    other.mkdir()
    publish(ws, ws.stack("one"), [_build(tmp_path, "one", "1.0+a")])
    assert not leftover.exists()
    assert other.exists()  # a run still going (this process) keeps its folder


def test_a_folder_with_other_files_is_not_replaced(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    out = tmp_path / "downloads"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(BuildError, match=r"notes\.txt"):
        publish(ws, ws.stack("one"), [_build(tmp_path, "one", "1.0+a")], out)
    assert _contents(out) == {"notes.txt": b"mine"}


def test_an_unchanged_publish_rewrites_nothing(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    builds = [_build(tmp_path, "one", "1.0+a")]
    out = publish(ws, ws.stack("one"), builds)
    inode = out.stat().st_ino
    publish(ws, ws.stack("one"), builds)
    assert out.stat().st_ino == inode


def test_gpu_runs_record_the_manifest_beside_the_patched_wheel(tmp_path: Path) -> None:
    from sm120fork.gpu.core.runs import run_environment

    def _manifest(where: Path) -> dict[str, object] | None:
        return run_environment({}, "patched", {"patched": where}).get("wheels_manifest")

    ws = _workspace(tmp_path)
    patched = publish(ws, ws.stack("one"), [_build(tmp_path, "one", "1.0+a")])
    written = json.loads((patched / "manifest.json").read_text())
    unpatched = tmp_path / "up"
    unpatched.mkdir()
    assert _manifest(patched) == written
    assert _manifest(patched / "demo_lib-1.0+a-py3-none-any.whl") == written
    assert _manifest(unpatched) is None
    (patched / "manifest.json").write_text('{"stack": "one"}')  # not a build's manifest
    refused = _manifest(patched)
    assert refused is not None
    assert "not a build manifest" in str(refused["error"])


def _made(distribution: str, wheel: str) -> ProjectBuild:
    return ProjectBuild(project=distribution, distribution=distribution, upstream_version="1",
                        version="1+sm120.1", wheel=Path(wheel), sha256="0" * 64, cached=True,
                        seconds=0.0, entry=_entry(distribution, wheel, "0" * 64))


def test_install_line_picks_one_wheel_per_platform_when_a_stack_ships_several(
        tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    out = ws.root / "wheels" / "s"
    pure = [_made("a", "a-1-py3-none-any.whl"), _made("b", "b-1-py3-none-any.whl")]
    assert pub.install_command(ws, out, pure) == (
        "pip install -c wheels/s/constraints.txt wheels/s/*.whl")
    per_platform = [*pure, _made("b", "b-1-cp312-cp312-manylinux_2_34_aarch64.whl")]
    # '*.whl' would hand pip the other platforms' wheels, which it refuses.
    assert pub.install_command(ws, out, per_platform) == (
        "pip install -c wheels/s/constraints.txt --find-links wheels/s a b")


def test_each_route_from_the_folder_and_from_the_index_pins_what_it_installs() -> None:
    """The build prints the folder's lines, the index's landing page the same routes with
    every version pinned; the plugin route names the plugin wheel itself, so that
    ``sglang==0.5.23`` cannot match our patched 0.5.23+sm120.1 from the index."""
    patched = dataclasses.replace(_entry("sglang", "sglang-0.5.23+sm120.1-py3-none-any.whl",
                                         "0" * 64), version="0.5.23+sm120.1")
    published = dataclasses.replace(_entry("flashinfer-python", "f.whl", "0" * 64),
                                    version="0.7.2", used_as_published=True)
    plugin = PublishedPlugin(wheel="sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl",
                             sha256="a" * 64, sglang="0.5.23", hooks=6)
    assert [(r.name, r.line) for r in folder_routes("wheels/s", [published, patched],
                                                    plugin)] == [
        ("patched wheels", "pip install -c wheels/s/constraints.txt wheels/s/*.whl"),
        ("stock SGLang + plugin", "pip install sglang==0.5.23 "
         "wheels/s/plugin/sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl")]
    aot = "sm120fork-flashinfer-aot==0.7.2+sm120.1.cu130"
    assert [r.line for r in index_routes("https://x.test/", [published, patched],
                                         plugin=plugin, aot=aot)] == [
        "pip install --extra-index-url https://x.test/simple/ flashinfer-python==0.7.2 "
        "sglang==0.5.23+sm120.1",
        "pip install --extra-index-url https://x.test/simple/ flashinfer-python==0.7.2 "
        "sglang==0.5.23+sm120.1 sm120fork-flashinfer-aot==0.7.2+sm120.1.cu130",
        "pip install sglang==0.5.23 https://x.test/files/sm120fork_sglang_plugin-0.5.23"
        f"%2Bsm120.1-py3-none-any.whl#sha256={'a' * 64}"]


def test_a_read_only_wheels_folder_is_one_error_naming_it_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a traceback and an internal error (exit 70): a BuildError naming the folder, how
    to make it writable, and where else to publish; before a build, and at publishing."""
    ws = _workspace(tmp_path)
    stack = ws.stack("one")
    wheels = ws.root / "wheels"
    wheels.mkdir()
    wheels.chmod(0o555)  # read-only for a user; root writes anyway, so also:
    real_mkdtemp = tempfile.mkdtemp

    def read_only(*args: object, **kw: object) -> str:
        where = Path(str(kw.get("dir")))
        if where == wheels:
            raise PermissionError(13, "Permission denied", str(where / "staging"))
        return real_mkdtemp(*args, **kw)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    try:
        with pytest.raises(BuildError) as err:
            publish(ws, stack, [_build(tmp_path, "one", "1.0+a")])
        message = err.value.message
        assert message == (f"{wheels}: cannot publish the wheels here: permission denied "
                           f"(make it writable (chmod u+w {wheels}) or publish elsewhere: "
                           "python -m sm120fork build --stack one --out DIR)")
        assert err.value.exit_code == BuildError.exit_code
        assert list(wheels.iterdir()) == []
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != wheels)
        with pytest.raises(BuildError, match="cannot publish the wheels here"):
            pub.check_writable(wheels / "one", stack)
        pub.check_writable(tmp_path / "elsewhere" / "one", stack)
    finally:
        wheels.chmod(0o755)


@pytest.mark.parametrize(("edit", "key", "what"), [
    (lambda d: d["wheels"][0].pop("sha256"), "wheels[0].sha256", "is missing"),
    (lambda d: d["wheels"][0]["source"].update(digest=7), "wheels[0].source.digest",
     "is int, not str"),
    (lambda d: d["wheels"][0]["patches"][0].pop("subject"), "wheels[0].patches[0].subject",
     "is missing"),
    (lambda d: d.update(wheels=[["not", "an", "entry"]]), "wheels[0]", "is list, not an object"),
    (lambda d: d.pop("stack"), "stack", "is missing"),
])
def test_a_manifest_that_is_not_one_is_refused_naming_the_file_and_key(
        tmp_path: Path, edit: Callable[[dict[str, Any]], object], key: str, what: str) -> None:
    """Every stage reads manifest.json through manifest.read: a malformed record names the
    file and the dotted key (it said "KeyError: 'sha256'")."""
    entry = _entry("lib", "lib-1.0-py3-none-any.whl", "a" * 64)
    entry = dataclasses.replace(entry, patches=(manifest_file.PatchRecord(
        name="0001-a.patch", sha256="b" * 64, subject="a", applied_upstream=""),))
    data = manifest_file.Manifest(stack="s", toolkit_version="0", wheels=(entry,)).to_json()
    assert manifest_file.Manifest.from_json(json.loads(json.dumps(data))).wheels == (entry,)
    edit(data)
    path = tmp_path / manifest_file.FILE
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        manifest_file.read(path)
    assert err.value.where == f"{path}: {key}"
    assert err.value.what == f"not a build manifest: {what}"
    assert manifest_file.load(path) is None  # the lenient readers show nothing built
