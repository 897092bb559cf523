"""The plugin on the real sglang 0.5.23 wheel and the real 0.5.23 series (network, ~2 min).

Stock sglang 0.5.23 is installed with ``--no-deps`` into a fresh directory; the fork
tree is its files laid out as the upstream repository (``python/``) with the series
applied by ``git am``; the plugin wheel is generated from that tree and built with
pypa/build; the "patched wheel" install is stock with the series' files replaced, as the
stack's wheel build repacks them.  The same behaviour cases (``plugin_probe.py``) run on
(a) the patched install and (b) stock + plugin through SGLang's own ``load_plugins()``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers_sglang import Sites

pytestmark = [pytest.mark.network, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parents[1]
_PLAIN: dict[tuple[Path, str], dict[str, Any]] = {}


def plain_probe(sites: Sites, site: Path, capability: str) -> dict[str, Any]:
    """An install (stock or patched) without the plugin, memoised: several tests compare
    against the same one, and each probe is a fresh interpreter importing torch."""
    if (site, capability) not in _PLAIN:
        _PLAIN[site, capability] = probe(sites, site, capability, plugin=False)
    return _PLAIN[site, capability]


def stock_probe(sites: Sites, capability: str) -> dict[str, Any]:
    """Stock sglang without the plugin."""
    return plain_probe(sites, sites.stock, capability)


SECOND_PLUGIN = '''\
"""A second sglang plugin: AROUND hooks on G1's target and on another function."""
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

CALLS = []
FUSION = "sglang.srt.layers.flashinfer_comm_fusion"


def _around(name):
    def hook(original, *args, **kwargs):
        CALLS.append(name)
        return original(*args, **kwargs)
    return hook


def load():
    for name in ("_resolve_backend", "is_flashinfer_allreduce_unavailable"):
        HookRegistry.register(f"{FUSION}.{name}", _around(name), HookType.AROUND)
'''


def second_plugin_site(base: Path) -> Path:
    """An installed second plugin (entry point ``zzprobe``), found after ours on the path."""
    site = base / "second-plugin"
    info = site / "zz_probe_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "zz_probe_plugin.py").write_text(SECOND_PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zz-probe-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nzzprobe = zz_probe_plugin:load\n")
    return site


def probe(sites: Sites, site: Path, capability: str, *, plugin: bool,
          env: dict[str, str] | None = None, second: Path | None = None) -> dict[str, Any]:
    paths = [str(sites.deps), str(ROOT / "src"), *([str(sites.plugin)] if plugin else []),
             *([str(second)] if second else [])]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **(env or {}))
    done = subprocess.run([sites.python, str(TESTS / "plugin_probe.py"), str(site),
                           capability, *(["--load-plugins"] if plugin else []),
                           *(["--second-plugin"] if second else [])],
                          capture_output=True, text=True, env=full, timeout=600, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("PLUGIN-PROBE "):
            result: dict[str, Any] = json.loads(line.removeprefix("PLUGIN-PROBE "))
            return result
    raise AssertionError(f"probe printed no result:\n{done.stderr[-3000:]}")


def test_every_patch_of_the_series_becomes_a_hook(sites: Sites) -> None:
    assert sites.spec.wheel_only == ()
    assert sorted({p for h in sites.spec.hooks for p in h.patch.split("+")}) == \
        sites.patch_ids
    assert {h.names[0] for h in sites.spec.hooks if h.kind == "replace"} == {
        "_resolve_backend", "_flashinfer_trtllm_workspace_allocation_sizes",
        "_flashinfer_allreduce_fusion_auto_enable", "flashinfer_ar_fusion_applies",
        "_set_all_reduce_flags", "FlashInferWorkspaceManager.initialize",
        "_forward_with_allreduce_fusion", "eligible_group",
        "PcieIpcCommunicator.should_pcie_ipc_ar",
        "GroupCoordinator._resolve_outplace_all_reduce_method"}
    # G6's new helpers, class and imports, and G7's helpers, are provided to the modules
    assert {h.patch for h in sites.spec.hooks if h.kind == "provide"} == {"G6", "G7"}
    # G7's policy reader and decision: a module of its own
    assert [(h.patch, h.module) for h in sites.spec.hooks if h.kind == "module"] == [
        ("G7", "sglang.srt.layers.sm120fork_allreduce")]


@pytest.mark.parametrize("capability", ["12.0", "12.1", "9.0"])
def test_plugin_on_stock_agrees_with_the_patched_wheel(sites: Sites, capability: str) -> None:
    patched = plain_probe(sites, sites.patched, capability)
    with_plugin = probe(sites, sites.stock, capability, plugin=True)
    # one line per function replaced or added; G6's imports ride along unnamed
    assert with_plugin["plugin"] == [
        f"sm120fork plugin: {h.label}: applied" for h in sites.spec.hooks if not h.carried]
    assert {n for h in sites.spec.hooks if h.carried for n in h.names} >= {
        "datetime", "time", "traceback"}
    assert patched["cases"].keys() == with_plugin["cases"].keys()
    disagree = {name: (patched["cases"][name], with_plugin["cases"][name])
                for name in patched["cases"]
                if patched["cases"][name] != with_plugin["cases"][name]}
    assert disagree == {}
    if capability.startswith("12."):  # the suite does tell the series from stock
        stock = stock_probe(sites, capability)
        assert sum(stock["cases"][n] != patched["cases"][n] for n in stock["cases"]) >= 10


@pytest.mark.parametrize("ours", ["on", "off"])
def test_a_second_plugin_loaded_after_ours_keeps_its_hooks(sites: Sites, tmp_path: Path,
                                                           ours: str) -> None:
    """SGLang's load_plugins() applies every plugin's hooks once all registered: ours must
    not apply early (that dropped the second plugin's hooks, on G1's target and others)."""
    env = {"SM120FORK_PLUGIN": "0"} if ours == "off" else {}
    result = probe(sites, sites.stock, "12.0", plugin=True, env=env,
                   second=second_plugin_site(tmp_path))
    assert "is_flashinfer_allreduce_unavailable" in result["second_plugin"]
    assert "_resolve_backend" in result["second_plugin"]
    reference = plain_probe(sites, sites.patched if ours == "on" else sites.stock, "12.0")
    assert result["cases"] == reference["cases"]  # G1 applied under the second's AROUND


def test_another_sglang_version_stays_stock(sites: Sites, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(sites.stock, other, copy_function=os.link, ignore=shutil.ignore_patterns(
        "sglang-0.5.23.dist-info"))
    info = other / "sglang-0.5.22.dist-info"
    shutil.copytree(sites.stock / "sglang-0.5.23.dist-info", info)
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.5.23\n", "Version: 0.5.22\n", 1))
    stock = stock_probe(sites, "12.0")
    result = probe(sites, other, "12.0", plugin=True)
    assert result["plugin"] == [
        f"sm120fork plugin: {h.label}: not applied (installed sglang 0.5.22; this plugin is "
        "for 0.5.23 (stack sglang-0.5.23))" for h in sites.spec.hooks]
    assert result["cases"] == stock["cases"]


def test_disabled_plugin_leaves_sglang_stock(sites: Sites) -> None:
    stock = stock_probe(sites, "12.0")
    result = probe(sites, sites.stock, "12.0", plugin=True, env={"SM120FORK_PLUGIN": "0"})
    assert result["plugin"] == ["sm120fork plugin: disabled by SM120FORK_PLUGIN=0; SGLang is stock"]
    assert result["cases"] == stock["cases"]


def test_the_plugin_wheels_doctor_runs_without_the_toolkit(sites: Sites) -> None:
    """``python -S``: no site-packages, so only the two --no-deps installs are importable."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(sites.stock), str(sites.plugin)]))
    done = subprocess.run([sys.executable, "-S", "-c", "import sys, importlib.util\n"
                           "assert importlib.util.find_spec('sm120fork') is None\n"
                           "from sm120fork_sglang_plugin.doctor import main\n"
                           "sys.exit(main(['--json', '--decide-timeout', '60']))"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    report = json.loads(done.stdout)
    hooks = report["packages"]["plugin_hooks"]
    assert [h["state"] for h in hooks] == ["applied"] * len(sites.spec.hooks)
    assert report["packages"]["plugin_active"] is True
    assert done.returncode == (15 if report["blockers"] else 0)
