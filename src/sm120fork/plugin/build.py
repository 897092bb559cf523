"""The plugin step of ``build``, for a stack whose SGLang has the plugin framework (0.5.11+):
generate the hooks from the fork tree (:mod:`.generate`), build the wheel (:mod:`.package`);
publishing puts it in ``<stack wheels>/plugin/`` with ``plugin.json``, apart from the
patched wheels, so ``pip install <dir>/*.whl`` installs one way or the other, never both.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sm120fork.declare import Stack
from sm120fork.patch.series import Series
from sm120fork.patch.tree import prepare_tree
from sm120fork.plugin import generate as generate_module
from sm120fork.plugin.generate import UPSTREAM_TAG, generate_spec, package_prefix, patch_commits
from sm120fork.plugin.package import DISTRIBUTION, build_plugin_wheel
from sm120fork.plugin.runtime import Spec
from sm120fork.util.files import atomic_write_text, read_json_object, sha256_file
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

FRAMEWORK_SINCE = Version("0.5.11")
FRAMEWORK_FILE = "sglang/srt/plugins/hook_registry.py"
PLUGIN_DIR = "plugin"
PLUGIN_JSON = "plugin.json"


@dataclass(frozen=True, kw_only=True)
class PluginResult:
    stack: str
    message: str                  # the one line the build prints
    wheel: Path | None = None
    spec: Spec | None = None
    cached: bool = False

    def entry(self) -> dict[str, object]:
        assert self.wheel is not None
        assert self.spec is not None
        return {
            "stack": self.stack, "distribution": DISTRIBUTION, "wheel": self.wheel.name,
            "sha256": sha256_file(self.wheel), "sglang": self.spec.version,
            "hooks": [{"patch": h.patch, "kind": h.kind,
                       "target": h.module + ("." + ",".join(h.names) if h.names else ""),
                       "upstream_sha256": h.upstream_sha256,
                       "patched_sha256": h.patched_sha256} for h in self.spec.hooks],
            "wheel_only": [{"patch": p, "why": w} for p, w in self.spec.wheel_only],
        }


def build_plugin(ws: Workspace, stack: Stack, series_of: Mapping[str, Series], *,
                 force: bool = False) -> PluginResult:
    """Generate and build the stack's plugin wheel (``series_of``: each project's series),
    or say why there is none."""
    project = next((p for p in stack.projects if p.normalized_name == "sglang"), None)
    if project is None:
        return PluginResult(stack=stack.name, message=f"stack {stack.name} has no sglang: "
                            "no plugin wheel")
    if Version(project.version) < FRAMEWORK_SINCE:
        return PluginResult(stack=stack.name, message=(
            f"sglang {project.version} has no plugin framework (SGLang {FRAMEWORK_SINCE}+): "
            "no plugin wheel for this stack; its patched sglang wheel is the way there"))
    series = series_of[project.key]
    ids = [p.subject.split()[0] for p in series.patches]
    cache = ws.state_dir / "plugins" / stack.name
    # The spec depends on the pin, the series and the generator only: with those unchanged
    # a rebuild touches no fork tree.
    key = hashlib.sha256(json.dumps({
        "project": project.build_inputs(), "series": series.digest,
        "generator": hashlib.sha256(Path(generate_module.__file__).read_bytes()).hexdigest(),
    }, sort_keys=True, default=str).encode()).hexdigest()[:24]
    spec_file = cache / f"spec-{key}.json"
    try:
        spec = Spec.from_json(json.loads(spec_file.read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # none cached, or of another shape
        tree = prepare_tree(ws, stack, project, patches=series.patches, force=force)
        framework = package_prefix(project.package_root) + FRAMEWORK_FILE
        if not tree.repo.exists(UPSTREAM_TAG, framework):
            return PluginResult(stack=stack.name, message=(
                f"sglang {project.version} ships no {FRAMEWORK_FILE}: no plugin wheel; its "
                "patched sglang wheel is the way there"))
        spec = generate_spec(tree.repo, patch_commits(tree.repo, ids),
                             package_root=project.package_root, package="sglang",
                             stack=stack.name, distribution=project.distribution,
                             version=project.version)
        cache.mkdir(parents=True, exist_ok=True)
        atomic_write_text(spec_file, json.dumps(spec.to_json()) + "\n")
    built = build_plugin_wheel(spec, project.local_label, cache)
    only = "; wheel only: " + ", ".join(f"{p} ({w})" for p, w in spec.wheel_only) \
        if spec.wheel_only else ""
    return PluginResult(stack=stack.name, wheel=built.wheel, spec=spec, cached=built.cached,
                        message=(f"plugin {built.wheel.name}: {len(spec.hooks)} hook(s) from "
                                 f"{len(ids)} patch(es){only}"))


@dataclass(frozen=True, kw_only=True)
class PublishedPlugin:
    """What ``<stack wheels>/plugin/plugin.json`` says of the plugin wheel beside it."""

    wheel: str
    sha256: str
    sglang: str
    hooks: int

    @classmethod
    def read(cls, stack_folder: Path) -> PublishedPlugin | None:
        """The folder's plugin, or None when the build made none."""
        data = read_json_object(stack_folder / PLUGIN_DIR / PLUGIN_JSON)
        if data is None:
            return None
        hooks = data.get("hooks")
        return cls(wheel=str(data.get("wheel")), sha256=str(data.get("sha256")),
                   sglang=str(data.get("sglang")),
                   hooks=len(hooks) if isinstance(hooks, list) else 0)


def plugin_files(result: PluginResult) -> dict[str, Path | str]:
    """What the release step publishes of the plugin: ``plugin/<wheel>`` and ``plugin.json``."""
    if result.wheel is None:
        return {}
    return {f"{PLUGIN_DIR}/{result.wheel.name}": result.wheel,
            f"{PLUGIN_DIR}/{PLUGIN_JSON}": json.dumps(result.entry(), indent=2) + "\n"}
