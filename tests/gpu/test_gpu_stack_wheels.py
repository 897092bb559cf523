"""``gpu test|bench --stack NAME``: variants from the stack's build and pin (issue 22 item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_manifest import entry, write_manifest
from sm120fork.errors import ConfigError, UsageError
from sm120fork.gpu.ab import run as runs
from sm120fork.gpu.core import stack_wheels
from sm120fork.gpu.layer import run as layer_run
from sm120fork.resolved import ResolvedStack
from sm120fork.workspace import Workspace

from helpers_ws import checkout_copy


def _resolved(name: str) -> ResolvedStack:
    ws = Workspace.find()
    return ResolvedStack.of(ws, ws.stack(name))


def _built(root: Path, stack: str, wheel: str, *, as_published: bool) -> Path:
    folder = root / "wheels" / stack
    folder.mkdir(parents=True)
    (folder / wheel).write_bytes(b"wheel")
    write_manifest(folder, stack, entry("flashinfer", wheel=wheel, sha256="ab" * 32,
                                        series_digest="cd" * 32,
                                        used_as_published=as_published))
    return folder / wheel


def test_the_stack_build_is_patched_and_upstream_comes_from_its_pin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = checkout_copy(tmp_path, sdists=False)
    monkeypatch.setenv("SM120FORK_ROOT", str(root))
    wheel = _built(root, "sglang-0.5.10", "flashinfer_python-0.6.7.post3+sm120.1-py3-none-any.whl",
                   as_published=False)
    built: list[str] = []

    def upstream(stack: ResolvedStack) -> Path:
        built.append(stack.name)
        return tmp_path / "flashinfer_python-0.6.7.post3-py3-none-any.whl"

    monkeypatch.setattr(stack_wheels, "upstream_wheel", upstream)
    found = stack_wheels.resolve(_resolved("sglang-0.5.10"), baseline=True)
    assert found.wheels == {
        "patched": wheel,
        "unpatched": tmp_path / "flashinfer_python-0.6.7.post3-py3-none-any.whl"}
    assert built == ["sglang-0.5.10"]
    found = stack_wheels.resolve(_resolved("sglang-0.5.10"), baseline=False)
    assert found.wheels == {"patched": wheel}


def test_a_stack_shipping_upstream_as_published_has_no_ab(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = checkout_copy(tmp_path, sdists=False)
    monkeypatch.setenv("SM120FORK_ROOT", str(root))
    _built(root, "sglang-0.5.23", "flashinfer_python-0.7.2-py3-none-any.whl", as_published=True)
    monkeypatch.setattr(stack_wheels, "upstream_wheel", lambda *_: pytest.fail("fetched"))
    found = stack_wheels.resolve(_resolved("sglang-0.5.23"), baseline=True)
    assert len(found.wheels) == 1
    assert found.note is not None
    assert "no A/B" in found.note


@pytest.mark.parametrize(("front_door", "fix"), [
    ("nox", "nox -s build -- --stack sglang-0.5.10"),
    ("", "python -m sm120fork build --stack sglang-0.5.10")])
def test_an_unbuilt_stack_says_how_to_build_it_in_the_form_the_user_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, front_door: str, fix: str) -> None:
    monkeypatch.setenv("SM120FORK_ROOT", str(checkout_copy(tmp_path, sdists=False)))
    monkeypatch.setenv("SM120FORK_FRONT_DOOR", front_door)
    with pytest.raises(ConfigError) as err:
        stack_wheels.resolve(_resolved("sglang-0.5.10"), baseline=True)
    assert err.value.fix == fix


def test_stack_and_wheel_dir_exclude_each_other() -> None:
    opts = runs.TestOptions(command="x", stack=_resolved("sglang-0.5.10"),
                            wheel_dirs={"patched": Path("a")})
    with pytest.raises(UsageError, match="exclude each other"):
        opts.with_stack(baseline=True)


@pytest.mark.usefixtures("gpu_here")
def test_a_bench_from_a_stack_records_its_provenance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stack, series digest and wheel sha256 in bench.json (upstream_pr's provenance)."""
    from sm120fork.gpu.bench import run as bench_run
    from sm120fork.gpu.cli import main
    from sm120fork.gpu.core import variants
    from sm120fork.util import proc

    root = checkout_copy(tmp_path, sdists=False)
    monkeypatch.setenv("SM120FORK_ROOT", str(root))
    _built(root, "sglang-0.5.23", "flashinfer_python-0.7.2-py3-none-any.whl", as_published=True)
    installed: list[str] = []

    def install(name: str, source: Path | None, work: Path, _prebuilt: object = None
                ) -> variants.Variant:
        installed.append(f"{name}={source}")
        return variants.Variant(name=name, wheel=source, sha256="ab" * 32, site=None,
                                jit_base=work / name)

    monkeypatch.setattr(variants, "install_variant", install)
    monkeypatch.setattr(variants, "compile_variants", lambda vs, *_a, **_k: {
        v.name: variants.ModuleBuild(ok=True, env={"gpu_count": 2, "gpus": ["Fake GPU"]})
        for v in vs})
    monkeypatch.setattr(bench_run, "run_group", lambda *_a, **kw: (
        [{"kind": "point", "method": m, "tokens": 1, "hidden": 7168, "status": "timed",
          "median_us": 5.0, "rank_medians_us": [5.0, 5.0], "rank_p90_us": [6.0, 6.0]}
         for m in kw["methods"]], {}, proc.GroupOutcome(ok=True)))
    out = tmp_path / "out"
    assert main(["bench", "--stack", "sglang-0.5.23", "--world-sizes", "2",
                 "--method", "fused_auto", "--work-dir", str(tmp_path / "w"),
                 "--out", str(out)]) == 0
    assert installed == [f"patched={root}/wheels/sglang-0.5.23/"
                         "flashinfer_python-0.7.2-py3-none-any.whl"]
    doc = json.loads((out / "bench.json").read_text())
    assert doc["stack"] == "sglang-0.5.23"
    assert doc["made_from"] == [{"project": "flashinfer", "series": "flashinfer/series",
                                 "series_digest": "cd" * 32,
                                 "wheel": "flashinfer_python-0.7.2-py3-none-any.whl",
                                 "wheel_sha256": "ab" * 32}]
    assert any("no A/B" in line for line in doc["not_run"])
    assert json.loads((out / "policy.json").read_text())["made"]["stack"] == "sglang-0.5.23"


def _zip_wheel(path: Path, files: dict[str, bytes]) -> str:
    import base64
    import hashlib
    import zipfile

    dist = path.name.split("-")[0] + "-" + path.name.split("-")[1] + ".dist-info"
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    rows = [f"{n},sha256={b64(d)},{len(d)}" for n, d in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{dist}/RECORD", "\n".join(rows) + "\n")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_layer_stack_unpacks_this_pythons_sglang_wheel_with_its_provenance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sglang-layer --stack``: the one command that re-makes a layer report of a stack."""
    root = checkout_copy(tmp_path, sdists=False)
    monkeypatch.setenv("SM120FORK_ROOT", str(root))
    folder = root / "wheels" / "sglang-0.5.23"
    folder.mkdir(parents=True)
    other = "sglang-0.5.23+sm120.1-cp39-cp39-win32.whl"  # no platform here takes it
    mine = "sglang-0.5.23+sm120.1-py3-none-any.whl"
    fi = "flashinfer_python-0.7.2-py3-none-any.whl"
    rows = []
    for name, project in ((other, "sglang"), (mine, "sglang"), (fi, "flashinfer")):
        top = "sglang" if project == "sglang" else "flashinfer"
        sha = _zip_wheel(folder / name, {f"{top}/__init__.py": name.encode()})
        rows.append(entry(project, wheel=name, sha256=sha, series_digest="e" * 64))
    write_manifest(folder, "sglang-0.5.23", *rows)
    trees = stack_wheels.layer_trees(Workspace.find().stack_wheels("sglang-0.5.23"),
                                   tmp_path / "work")
    assert (trees.sglang_path / "sglang" / "__init__.py").read_bytes() == mine.encode()
    assert [p.name for p in trees.site] == ["flashinfer"]
    assert trees.made["stack"] == "sglang-0.5.23"
    assert [m["wheel"] for m in trees.made["made_from"]] == [mine, fi]
    opts = layer_run.LayerOptions(command="x", sglang_path=trees.sglang_path,
                             out=tmp_path / "out", layout="layer_boundary", made=trees.made)
    layer_run._publish(opts, [], [("patched", "fused")], [], finished=False)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["made_from"] == trees.made["made_from"]
    assert (doc["finished"], doc["planned"]) == (False, ["fused"])


def test_a_layer_tree_is_unpacked_only_from_the_wheel_its_manifest_lists(
        tmp_path: Path) -> None:
    folder = tmp_path / "kit" / "stack"
    folder.mkdir(parents=True)
    name = "sglang-0.5.23+sm120.1-py3-none-any.whl"
    _zip_wheel(folder / name, {"sglang/__init__.py": b"x"})
    write_manifest(folder, "sglang-0.5.23", entry("sglang", wheel=name, sha256="0" * 64))
    with pytest.raises(ConfigError, match="is not the wheel its manifest lists"):
        stack_wheels.layer_trees(folder, tmp_path / "work")


def test_layer_needs_stack_or_sglang_path_not_both(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from sm120fork.gpu import cli

    assert cli.main(["sglang-layer", "--out", str(tmp_path)]) == UsageError.exit_code
    assert "give one of --stack, --stack-dir, --sglang-path" in capsys.readouterr().err
    assert cli.main(["sglang-layer", "--stack", "x", "--sglang-path", str(tmp_path),
                     "--out", str(tmp_path)]) == UsageError.exit_code
