"""The plugin generator and runtime on a fixture fork tree (offline, seconds).

The fork tree is a real git repo laid out like the build's: upstream tagged ``upstream``,
one commit per patch.  The package under test is a tiny stand-in for SGLang (``fakesg``)
installed with a dist-info, so version checks and file lookups run as they do for SGLang.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import shutil
import sys
import textwrap
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sm120fork.package.stack import build_stack
from sm120fork.plugin import build as plugin_build
from sm120fork.plugin import runtime
from sm120fork.plugin.generate import generate_spec, patch_commits
from sm120fork.resolved import ResolvedStack
from sm120fork.util.git import Git
from sm120fork.workspace import Workspace

from conftest import git, isolate_git, make_patch, make_upstream, stack_toml, write_series
from helpers_ws import project_entry

GATES = '''\
"""Stand-in for an SGLang module with module-level gates."""
from __future__ import annotations

import logging
from os import getcwd

logger = logging.getLogger(__name__)
SUPPORTED = (9, 10)
_registry: list[str] = []


def register(fn):
    _registry.append(fn.__name__)
    return fn


@register
def gate(major: int) -> bool:
    """True where the fused path may run."""
    return major in SUPPORTED


def resolve(major: int) -> str:
    if not gate(major):
        raise ValueError("requires SM90 or SM10X")
    return "trtllm"
'''

CONSUMER = '''\
from fakesg.gates import gate


def decide(major: int) -> bool:
    return gate(major)
'''

#: (patch id, {path: (old, new)}) applied in order on top of upstream.
PATCHES: list[tuple[str, dict[str, tuple[str, str]]]] = [
    ("G1", {"python/fakesg/gates.py": (
        "    return major in SUPPORTED\n",
        "    return major in SUPPORTED or _is_sm12x(major)\n")}),
    ("G2", {"python/fakesg/gates.py": (
        '        raise ValueError("requires SM90 or SM10X")\n',
        '        raise ValueError(f"requires SM90, SM10X or SM12X (cwd {getcwd()!r}, '
        '{path.sep})")\n')}),
    ("G3", {"python/fakesg/gates.py": (
        "from os import getcwd\n",
        "from os import getcwd, path\n\nSM12X_MAJOR = 12\n\n\n"
        "def _is_sm12x(major: int) -> bool:\n    return major == SM12X_MAJOR\n")}),
]
WHEEL_ONLY_PATCH = ("G4", {"python/fakesg/gates.py": (
    "SUPPORTED = (9, 10)\n", "SUPPORTED = (9, 10, 11)\n")})


def make_fork_tree(base: Path, patches: list[tuple[str, dict[str, tuple[str, str]]]]) -> Git:
    repo = base / "fork"
    (repo / "python" / "fakesg").mkdir(parents=True)
    (repo / "python" / "fakesg" / "__init__.py").write_text("")
    (repo / "python" / "fakesg" / "gates.py").write_text(GATES)
    (repo / "python" / "fakesg" / "consumer.py").write_text(CONSUMER)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "upstream")
    git(repo, "tag", "upstream")
    for pid, edits in patches:
        for rel, (old, new) in edits.items():
            text = (repo / rel).read_text()
            assert old in text, (pid, old)
            (repo / rel).write_text(text.replace(old, new, 1))
        git(repo, "commit", "-q", "-am", f"{pid} change")
    return Git(repo)


def spec_for(repo: Git, ids: list[str], version: str = "1.0") -> runtime.Spec:
    return generate_spec(repo, patch_commits(repo, ids), prefix="python/",
                         package="fakesg", stack="fake-1.0", distribution="fakesg",
                         version=version)


def install(repo: Git, rev: str, dest: Path, version: str) -> Path:
    """Check ``rev``'s package out into ``dest`` with a dist-info, like an installed wheel."""
    dest.mkdir(parents=True)
    for rel in ("__init__.py", "gates.py", "consumer.py"):
        target = dest / "fakesg" / rel
        target.parent.mkdir(exist_ok=True)
        target.write_text(repo("show", f"{rev}:python/fakesg/{rel}", strip=False))
    info = dest / f"fakesg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakesg\nVersion: {version}\n")
    return dest


def fakesg(module: str) -> Any:
    return importlib.import_module(f"fakesg.{module}")


class FakeRegistry:
    """SGLang's REPLACE semantics: set the attribute, rebind from-imported names.

    ``apply`` is what SGLang's ``load_plugins()`` does once every plugin registered; the
    plugin itself must never call it (``applied`` counts the calls)."""

    def __init__(self) -> None:
        self.hooks: list[tuple[str, Callable[..., Any]]] = []
        self.applied = 0

    def register(self, target: str, fn: Callable[..., Any]) -> None:
        self.hooks.append((target, fn))

    def unregister(self, target: str, fn: Callable[..., Any]) -> None:
        self.hooks = [(t, f) for t, f in self.hooks if not (t == target and f is fn)]

    @property
    def pair(self) -> tuple[Callable[[str, Callable[..., Any]], None],
                            Callable[[str, Callable[..., Any]], None]]:
        return self.register, self.unregister

    def apply(self) -> None:
        self.applied += 1
        for target, fn in self.hooks:
            owner_name, _, attr = target.rpartition(".")
            try:
                owner: Any = importlib.import_module(owner_name)
            except ImportError:
                module_name, _, cls = owner_name.rpartition(".")
                owner = getattr(importlib.import_module(module_name), cls)
            original = vars(owner)[attr]
            setattr(owner, attr, fn)
            for mod in list(sys.modules.values()):
                if isinstance(mod, types.ModuleType) and vars(mod).get(attr) is original:
                    setattr(mod, attr, fn)


@pytest.fixture
def fork(tmp_path: Path) -> Git:
    return make_fork_tree(tmp_path, PATCHES)


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """Put an install dir first on sys.path; forget fakesg and the runtime's report after."""
    def use(path: Path) -> None:
        monkeypatch.syspath_prepend(str(path))
        importlib.invalidate_caches()
    runtime._reset_for_tests()
    yield use
    for name in [m for m in sys.modules if m == "fakesg" or m.startswith("fakesg.")]:
        del sys.modules[name]
    runtime._reset_for_tests()


def test_generator_classifies_each_unit(fork: Git) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    kinds = {(h.kind, h.names, h.patch) for h in spec.hooks}
    assert kinds == {
        ("replace", ("gate",), "G1"),
        ("replace", ("resolve",), "G2"),
        ("provide", ("path",), "G3"),          # name added to `from os import getcwd`
        ("provide", ("SM12X_MAJOR",), "G3"),   # a new literal constant
        ("provide", ("_is_sm12x",), "G3"),     # a new helper function
    }
    gate = next(h for h in spec.hooks if h.names == ("gate",))
    upstream = runtime.ModuleUnits.parse(GATES).function("gate")
    assert upstream is not None
    assert upstream.startswith("@register\ndef gate")
    assert gate.upstream_sha256 == runtime.sha256_text(upstream)
    assert "_is_sm12x(major)" in gate.source
    assert gate.patched_sha256 != gate.upstream_sha256
    assert next(h for h in spec.hooks if h.names == ("path",)).source == "from os import path\n"
    assert spec.wheel_only == ()


def test_start_up_lines_name_the_functions_not_the_globals_carried_along(
        fork: Git, tmp_path: Path, site: Callable[[Path], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """G3 provides an import name and a constant its helper uses: they are applied with
    it, but the start-up lines (and the doctor) name only functions."""
    spec = spec_for(fork, ["G1", "G2", "G3"])
    site(install(fork, "upstream", tmp_path / "stock", "1.0"))
    fakesg("consumer")
    with caplog.at_level(logging.INFO, logger="sm120fork.plugin"):
        statuses = runtime.activate(spec, registry=FakeRegistry().pair, environ={})
    assert [s.carried for s in statuses] == [h.names in (("path",), ("SM12X_MAJOR",))
                                             for h in spec.hooks]
    lines = [r.getMessage() for r in caplog.records]
    assert sorted(lines) == sorted(f"sm120fork plugin: {h.label}: applied"
                                   for h in spec.hooks if h.names in (("gate",), ("resolve",),
                                                                      ("_is_sm12x",)))
    assert not any("path" in x.split(": ")[1] or "SM12X_MAJOR" in x for x in lines)


def test_module_level_code_is_wheel_only(tmp_path: Path) -> None:
    repo = make_fork_tree(tmp_path, [*PATCHES, WHEEL_ONLY_PATCH])
    spec = spec_for(repo, ["G1", "G2", "G3", "G4"])
    assert spec.wheel_only == (
        ("G4", "changes module-level code in fakesg/gates.py (assign SUPPORTED)"),)
    assert {h.patch for h in spec.hooks} == {"G1", "G2", "G3"}


def test_series_and_tree_must_match(fork: Git) -> None:
    with pytest.raises(Exception, match="3 commits after 'upstream' but the series has 2"):
        patch_commits(fork, ["G1", "G2"])


def test_applies_every_hook_and_rebinds_from_imports(fork: Git, tmp_path: Path,
                                                     site: Callable[[Path], None]) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    site(install(fork, "upstream", tmp_path / "stock", "1.0"))
    consumer, gates = fakesg("consumer"), fakesg("gates")  # imported first, as in SGLang
    assert consumer.decide(12) is False
    registry = FakeRegistry()
    statuses = runtime.activate(spec, registry=registry.pair, environ={})
    assert [s.state for s in statuses] == ["applied"] * 5, [s.line for s in statuses]
    assert registry.applied == 0  # SGLang's load_plugins() applies, after every plugin
    assert consumer.decide(12) is False
    registry.apply()
    assert consumer.decide(12) is True
    assert gates.gate(12) is True
    assert gates.gate(8) is False
    with pytest.raises(ValueError, match="SM12X"):
        gates.resolve(8)
    assert gates._registry == ["gate"]  # upstream's decorator is not run a second time
    # once per process: a second call reports the first and changes nothing
    assert runtime.activate(spec, registry=registry.pair,
                            environ={}) is statuses
    assert len(registry.hooks) == 2


def test_mismatch_leaves_everything_stock(fork: Git, tmp_path: Path,
                                          site: Callable[[Path], None],
                                          caplog: pytest.LogCaptureFixture) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    stock = install(fork, "upstream", tmp_path / "stock", "1.0")
    gates_py = stock / "fakesg" / "gates.py"
    gates_py.write_text(gates_py.read_text().replace('"requires SM90 or SM10X"',
                                                     '"requires SM90/SM10X"'))
    site(stock)
    gates = fakesg("gates")
    before = dict(vars(gates))
    registry = FakeRegistry()
    statuses = runtime.activate(spec, registry=registry.pair, environ={})
    by_name = {s.label.rsplit(".", 1)[1]: s for s in statuses}
    assert by_name["resolve"].state == "not applied"
    assert "differs from upstream's" in by_name["resolve"].why
    assert all(s.state == "not applied" for s in statuses)
    assert "held back because G2 fakesg.gates.resolve cannot apply" in by_name["gate"].why
    assert registry.hooks == []
    assert vars(gates) == before
    lines = [r.getMessage() for r in caplog.records if r.name == "sm120fork.plugin"]
    assert len(lines) == 5
    assert all(line.startswith("sm120fork plugin: G") for line in lines)


def test_other_version_is_one_line_per_hook_and_stock(fork: Git, tmp_path: Path,
                                                      site: Callable[[Path], None]) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    site(install(fork, "upstream", tmp_path / "stock", "1.1"))
    registry = FakeRegistry()
    statuses = runtime.activate(spec, registry=registry.pair, environ={})
    assert {s.why for s in statuses} == {
        "installed fakesg 1.1; this plugin is for 1.0 (stack fake-1.0)"}
    assert len(statuses) == 5
    assert registry.hooks == []
    assert "fakesg.gates" not in sys.modules


def test_patched_install_needs_nothing(fork: Git, tmp_path: Path,
                                       site: Callable[[Path], None]) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    site(install(fork, "HEAD", tmp_path / "patched", "1.0+sm120.1"))
    statuses = runtime.evaluate(spec)
    assert {s.state for s in statuses} == {"not needed"}, [s.line for s in statuses]


def test_disabled_by_environment(fork: Git, tmp_path: Path,
                                 site: Callable[[Path], None]) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    site(install(fork, "upstream", tmp_path / "stock", "1.0"))
    registry = FakeRegistry()
    assert runtime.activate(spec, registry=registry.pair,
                            environ={"SM120FORK_PLUGIN": "0"}) == []
    assert registry.hooks == []
    assert "fakesg.gates" not in sys.modules


def test_a_hook_that_cannot_compile_leaves_registry_and_modules_untouched(
        fork: Git, tmp_path: Path, site: Callable[[Path], None]) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    broken = tuple(dataclasses.replace(h, source=h.source.replace("return", "return (", 1))
                   if h.names == ("resolve",) else h for h in spec.hooks)
    spec = dataclasses.replace(spec, hooks=broken)
    site(install(fork, "upstream", tmp_path / "stock", "1.0"))
    gates = fakesg("gates")
    before = dict(vars(gates))
    registry = FakeRegistry()
    statuses = runtime.activate(spec, registry=registry.pair, environ={})
    assert {s.state for s in statuses} == {"not applied"}
    assert "preparing failed, SGLang left stock: SyntaxError" in statuses[0].why
    assert registry.hooks == []
    assert vars(gates) == before


def test_a_failing_registration_takes_ours_out_again(
        fork: Git, tmp_path: Path, site: Callable[[Path], None]) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    site(install(fork, "upstream", tmp_path / "stock", "1.0"))
    gates = fakesg("gates")
    before = dict(vars(gates))
    registry = FakeRegistry()
    def other() -> None:
        return None

    registry.register("fakesg.gates.gate", other)  # another plugin's hook stays

    def register(target: str, fn: Callable[..., Any]) -> None:
        if target.endswith(".resolve"):
            raise RuntimeError("registry refused")
        registry.register(target, fn)

    statuses = runtime.activate(spec, registry=(register, registry.unregister), environ={})
    assert {s.state for s in statuses} == {"not applied"}
    assert "RuntimeError: registry refused" in statuses[0].why
    assert registry.hooks == [("fakesg.gates.gate", other)]
    assert vars(gates) == before


def test_a_second_plugin_loaded_after_ours_keeps_its_hooks(
        fork: Git, tmp_path: Path, site: Callable[[Path], None]) -> None:
    """Ours only registers; the host's one apply step then applies both plugins' hooks."""
    spec = spec_for(fork, ["G1", "G2", "G3"])
    site(install(fork, "upstream", tmp_path / "stock", "1.0"))
    consumer, gates = fakesg("consumer"), fakesg("gates")
    registry = FakeRegistry()
    runtime.activate(spec, registry=registry.pair, environ={})
    registry.register("fakesg.consumer.decide", lambda major: "second plugin")
    registry.apply()
    assert consumer.decide(12) == "second plugin"
    assert gates.gate(12) is True


def test_plugin_project_vendors_toolkit_files_unchanged(fork: Git, tmp_path: Path) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    project = plugin_build.write_project(spec, "sm120.1", tmp_path / "project")
    pkg = project / plugin_build.IMPORT_PACKAGE
    for rel in plugin_build.vendored_files():
        assert (pkg / rel).read_bytes() == (plugin_build.TOOLKIT / rel).read_bytes(), rel
    assert runtime.Spec.from_json(json.loads((pkg / "hooks.json").read_text())) == spec
    assert 'version = "1.0+sm120.1"' in (project / "pyproject.toml").read_text()


@pytest.mark.network
@pytest.mark.slow
def test_plugin_wheel_builds_with_entry_point_and_script(fork: Git, tmp_path: Path) -> None:
    spec = spec_for(fork, ["G1", "G2", "G3"])
    built = plugin_build.build_plugin_wheel(spec, "sm120.1", tmp_path / "cache")
    assert built.wheel.name == "sm120fork_sglang_plugin-1.0+sm120.1-py3-none-any.whl"
    with zipfile.ZipFile(built.wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read("sm120fork_sglang_plugin-1.0+sm120.1.dist-info/"
                               "entry_points.txt").decode()
    assert "sm120fork_sglang_plugin/plugin/runtime.py" in names
    assert "sm120fork_sglang_plugin/hooks.json" in names
    assert textwrap.dedent("""\
        [sglang.srt.plugins]
        sm120fork = sm120fork_sglang_plugin:load""") in entry_points
    assert "sm120fork-doctor = sm120fork_sglang_plugin.doctor:main" in entry_points
    again = plugin_build.build_plugin_wheel(spec, "sm120.1", tmp_path / "cache")
    assert again.cached
    assert again.wheel == built.wheel
    # the installed wheel's doctor reads the policy with the vendored reader (issue 22)
    assert {"sm120fork_sglang_plugin/gpu/policy.py",
            "sm120fork_sglang_plugin/gpu/methods.py"} <= names
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "-q", "install", "--no-deps", "--no-compile",
                    "--target", str(tmp_path / "site"), str(built.wheel)], check=True)
    _check_plugin_doctor_policy(tmp_path / "site", tmp_path)


def _sglang_stack(tmp_path: Path, version: str, framework: bool) -> Workspace:
    files = {"sglang/srt/plugins/hook_registry.py": "# stand-in for the framework\n"} \
        if framework else {}
    up = make_upstream(tmp_path / "upstreams", "sglang", version, files=files)
    root = tmp_path / "toolkit"
    (root / "forks").mkdir(parents=True)
    (root / "forks" / "s.toml").write_text(stack_toml("s", [project_entry("sglang", up)]))
    series = root / "patches" / "s" / "sglang"
    patch = make_patch(up.repo, series, "G1 gate: allow 12", {
        "sglang/__init__.py": ("return [9, 10]", "return [9, 10, 12]")},
        "sglang/__init__.py: return [9, 10, 12]")
    write_series(series, [patch.name])
    return Workspace(root)


@dataclasses.dataclass(frozen=True)
class Built:
    """Stack ``s`` (sglang 0.5.23 with the plugin framework) built once, and the series
    folders the build read."""

    ws: Workspace
    loaded: list[Path]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    from sm120fork import resolved as resolved_module
    from sm120fork.patch import series as series_module

    base = tmp_path_factory.mktemp("built")
    loaded: list[Path] = []

    def counting(directory: Path) -> series_module.Series:
        loaded.append(directory)
        return series_module.load_series(directory)

    with pytest.MonkeyPatch.context() as mp:
        isolate_git(mp, base)
        ws = _sglang_stack(base, "0.5.23", framework=True)
        mp.setattr(resolved_module, "load_series", counting)  # the plugin step reads none
        build_stack(ws, ws.stack("s"))
    return Built(ws=ws, loaded=loaded)


def test_build_publishes_the_plugin_beside_the_patched_wheel(built: Built) -> None:
    ws = built.ws
    plugin_dir = ws.stack_wheels("s") / "plugin"
    assert [w.name for w in plugin_dir.glob("*.whl")] == [
        "sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl"]
    entry = json.loads((plugin_dir / "plugin.json").read_text())
    assert [(h["patch"], h["target"]) for h in entry["hooks"]] == [
        ("G1", "sglang.supported_majors")]
    assert [w.name for w in ws.stack_wheels("s").glob("*.whl")] == [
        "sglang-0.5.23+sm120.1-py3-none-any.whl"]


def test_a_build_loads_each_series_once(built: Built) -> None:
    """The series is read once per build and handed on (it was read four times)."""
    assert built.loaded == [built.ws.root / "patches" / "s" / "sglang"]


def _tree(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``folder``: bytes, inode and mtime (a rewrite changes the last two)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_ino,
                                               p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_build_with_the_plugin_leaves_the_folder_as_it_was(built: Built) -> None:
    ws = built.ws
    out = ws.stack_wheels("s")
    first = _tree(out)
    assert "plugin/plugin.json" in first
    build_stack(ws, ws.stack("s"))  # failed: "it holds files a build did not publish (plugin)"
    assert _tree(out) == first


def test_the_plugin_is_swapped_in_with_the_wheels(tmp_path: Path) -> None:
    """A new series replaces wheel and plugin in the one swap: no old plugin is left."""
    ws = _sglang_stack(tmp_path, "0.5.23", framework=True)
    build_stack(ws, ws.stack("s"))
    out = ws.stack_wheels("s")
    (out / "plugin" / "sm120fork_sglang_plugin-0.5.23+sm120.0-py3-none-any.whl").write_bytes(
        b"an older build's plugin")
    series = ws.root / "patches" / "s" / "sglang"
    patch = next(series.glob("*.patch"))
    patch.write_text(patch.read_text().replace("allow 12", "allow 12 and 13"))
    build_stack(ws, ws.stack("s"))
    assert sorted(_tree(out)) == [
        "constraints.txt", "manifest.json", "plugin/plugin.json",
        "plugin/sm120fork_sglang_plugin-0.5.23+sm120.1-py3-none-any.whl",
        "sglang-0.5.23+sm120.1-py3-none-any.whl"]
    manifest = json.loads((out / "manifest.json").read_text())
    plugin = json.loads((out / "plugin" / "plugin.json").read_text())
    assert manifest["wheels"][0]["patches"][0]["sha256"] == hashlib.sha256(
        patch.read_bytes()).hexdigest()
    assert plugin["sha256"] == hashlib.sha256(
        (out / "plugin" / plugin["wheel"]).read_bytes()).hexdigest()


def test_build_says_an_old_sglang_has_no_plugin_framework(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ws = _sglang_stack(tmp_path, "0.5.10.post1", framework=False)
    caplog.set_level(logging.INFO, logger="sm120fork")
    build_stack(ws, ws.stack("s"))
    assert not (ws.stack_wheels("s") / "plugin").exists()
    assert ("sglang 0.5.10.post1 has no plugin framework (SGLang 0.5.11+): no plugin wheel for "
            "this stack; its patched sglang wheel is the way there") in caplog.messages


def test_rebuild_with_nothing_changed_touches_no_fork_tree(tmp_path: Path) -> None:
    ws = _sglang_stack(tmp_path, "0.5.23", framework=True)
    build_stack(ws, ws.stack("s"))
    shutil.rmtree(ws.trees_dir)  # a second build must not need the fork tree
    from sm120fork.plugin.build import build_plugin
    again = build_plugin(ws, ws.stack("s"), ResolvedStack.named(ws, "s").series)
    assert again.cached
    assert not ws.trees_dir.exists()  # no fork tree was made again


CLASS_BEFORE = '''\
class Manager:
    """Holds a workspace."""

    size = 1

    def initialize(self, n):
        return n

    def cleanup(self):
        return None
'''


@pytest.mark.parametrize(("edit", "expected"), [
    (("        return n\n", "        return n + 1\n"), ("replace", ("Manager.initialize",))),
    (("    size = 1\n", "    size = 2\n"), ("wheel only", ())),
    (("        return n\n", "        return super().initialize(n)\n"), ("wheel only", ())),
    (("    def initialize", "    @staticmethod\n    def initialize"), ("wheel only", ())),
])
def test_a_class_changed_only_inside_plain_methods_is_one_replace_per_method(
        edit: tuple[str, str], expected: tuple[str, tuple[str, ...]]) -> None:
    from sm120fork.plugin.generate import diff_file

    after = CLASS_BEFORE.replace(*edit)
    (change,) = diff_file("pkg/m.py", CLASS_BEFORE, after)
    assert (change.kind or "wheel only", change.names if change.kind else ()) == expected
    if change.kind == "replace":
        assert change.source == runtime.ModuleUnits.parse(after).function("Manager.initialize")
        assert change.source.startswith("    def initialize(self, n):\n")


def test_a_replaced_method_is_compiled_outside_its_class() -> None:
    hook = runtime.Hook(patch="G9", kind="replace", module="m", path="m.py",
                        names=("Manager.initialize",),
                        source=("    @register\n    def initialize(self, n):\n"
                                "        return n + 1\n"),
                        patched_sha256="", upstream_sha256="")
    module = types.ModuleType("m")
    bound = runtime._compile_unit(hook, module, 0)  # no NameError: `register` is not run
    assert bound["initialize"](None, 1) == 2


def _plugin_doctor(site: Path, home: Path, env: dict[str, str]) -> dict[str, Any]:
    """The plugin package's doctor in ``python -S`` (no site-packages, so no toolkit):
    its --json report (no GPU here: blockers, exit 15)."""
    import os
    import subprocess

    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",
                                                              "SGLANG_SM120_ALLREDUCE_POLICY")}
    full.update(PYTHONPATH=str(site), HOME=str(home), CUDA_VISIBLE_DEVICES="", **env)
    done = subprocess.run([sys.executable, "-S", "-c", textwrap.dedent("""\
        import sys, importlib.util
        assert importlib.util.find_spec("sm120fork") is None
        from sm120fork_sglang_plugin.doctor import main
        sys.exit(main(["--json", "--decide-timeout", "30"]))""")],
        capture_output=True, text=True, env=full, timeout=300, check=False)
    assert done.returncode == 15, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _check_plugin_doctor_policy(site: Path, tmp_path: Path) -> None:
    from sm120fork.gpu import policy

    doc = policy.derive({2: [
        {"kind": "point", "method": m, "tokens": t, "hidden": 4096, "status": "timed",
         "median_us": us, "rank_medians_us": [us]}
        for m, t, us in (("fused_auto", 1, 5.0), ("nccl_rmsnorm", 1, 9.0),
                         ("fused_auto", 128, 30.0), ("nccl_rmsnorm", 128, 20.0))]},
        made={"created": "2026-12-01", "gpu": "RTX PRO 6000", "gpu_count": 2},
        for_use=True)
    home = tmp_path / "home"
    policy.write(doc, tmp_path / "measured")
    named = _plugin_doctor(site, home, {policy.ENV_VAR: str(tmp_path / "measured" /
                                                            "policy.json")})
    # the plugin wheel's doctor looks at the Python it is installed in (beside SGLang)
    assert named["python"] == {"path": sys.executable, "why": "the Python sm120fork-doctor "
                               "is installed in; --python names another"}
    assert named["text"]["policy"][0] == (f"policy file: {tmp_path}/measured/policy.json "
                                          f"(named by {policy.ENV_VAR})")
    tp2 = named["policy"]["tp"][0]
    assert (tp2["tp"], tp2["decided_by"]) == (2, "policy")
    assert [(r["min_tokens"], r["max_tokens"], r["method"]) for r in tp2["measured"]] == [
        (1, 1, "fused_auto"), (2, 128, "nccl_rmsnorm")]
    assert any(x.startswith("all-reduce at TP2: ") and x.endswith(
        f"(policy {tmp_path}/measured/policy.json, measured 2026-12-01 on RTX PRO 6000 x2)")
        for x in named["text"]["policy"])
    # no variable: the default place under the home folder, where SGLang looks too
    absent = _plugin_doctor(site, home, {})
    assert absent["policy"]["source"]["path"] == str(
        home / ".config" / "sm120fork" / "allreduce-policy.json")
    assert absent["text"]["policy"][1] == "no policy there: SGLang keeps today's decision"
    assert any(x.startswith("all-reduce at TP2: ") and "(today's rule: our fused path at "
               "TP2 only; no policy at " in x for x in absent["text"]["policy"])


def test_the_plugin_projects_doctor_prints_the_policy_without_the_toolkit(
        fork: Git, tmp_path: Path) -> None:
    """The plugin's files as the build lays them out (no wheel build: offline)."""
    project = plugin_build.write_project(spec_for(fork, ["G1", "G2", "G3"]), "sm120.1",
                                    tmp_path / "project")
    assert (project / plugin_build.IMPORT_PACKAGE / "gpu" / "policy.py").read_bytes() == (
        plugin_build.TOOLKIT / "gpu" / "policy.py").read_bytes()
    _check_plugin_doctor_policy(project, tmp_path)


NEW_MODULE = '''\
"""A module the series adds."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Rule:
    major: int


def allowed(major: int) -> bool:
    return Rule(major).major == 12
'''


def test_a_module_the_series_adds_is_one_module_hook_installed_first(
        tmp_path: Path, site: Callable[[Path], None]) -> None:
    """G7 adds a module (sglang/srt/layers/sm120fork_allreduce.py) that the functions it
    replaces import: the plugin carries its text and puts it in place before them."""
    repo = make_fork_tree(tmp_path, PATCHES)
    (repo.path / "python" / "fakesg" / "rules.py").write_text(NEW_MODULE)
    text = (repo.path / "python" / "fakesg" / "gates.py").read_text()
    (repo.path / "python" / "fakesg" / "gates.py").write_text(text.replace(
        "    return major in SUPPORTED or _is_sm12x(major)\n",
        "    from fakesg.rules import allowed\n\n"
        "    return major in SUPPORTED or allowed(major)\n"))
    git(repo.path, "add", "-A")
    git(repo.path, "commit", "-q", "-m", "G7 change")
    spec = spec_for(repo, ["G1", "G2", "G3", "G7"])
    assert spec.wheel_only == ()
    (module,) = [h for h in spec.hooks if h.kind == "module"]
    assert (module.module, module.source, module.label) == (
        "fakesg.rules", NEW_MODULE, "G7 fakesg.rules (new module)")
    site(install(repo, "upstream", tmp_path / "stock", "1.0"))
    gates = fakesg("gates")
    registry = FakeRegistry()
    statuses = runtime.activate(spec, registry=registry.pair, environ={})
    assert all(s.state == "applied" for s in statuses), [s.line for s in statuses]
    registry.apply()
    assert gates.gate(12) is True
    assert gates.gate(8) is False
    assert fakesg("rules").Rule(12).major == 12
    # an installed SGLang with a file of that name of its own: nothing applies
    runtime._reset_for_tests()
    (tmp_path / "stock" / "fakesg" / "rules.py").write_text("OTHER = 1\n")
    states = {s.label: s.state for s in runtime.evaluate(spec)}
    assert states["G7 fakesg.rules (new module)"] == "not applied"
