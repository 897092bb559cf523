"""A complete toolkit workspace around tiny upstream projects."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from sm120fork.workspace import Workspace

from conftest import Upstream, make_patch, make_upstream, stack_toml, write_series

STACK = "demo"
CHECKOUT = Path(__file__).resolve().parents[1]


#: The checkout's own download cache (what `nox -s build` fills): every copy below shares
#: it, so each pinned sdist and wheel is downloaded once per checkout, not once per test
#: module and run.  Every use checks the file's sha256; downloads land atomically, so two
#: workers may share it.
DOWNLOADS = CHECKOUT / ".forks" / "cache"


def checkout_copy(base: Path, *, sdists: bool = True) -> Path:
    """A toolkit root under ``base`` with this checkout's ``forks/`` and ``patches/``; with
    ``sdists``, its download cache (sdists and wheels) is the checkout's, shared."""
    root = base / "toolkit"
    root.mkdir()
    shutil.copytree(CHECKOUT / "forks", root / "forks")
    shutil.copytree(CHECKOUT / "patches", root / "patches")
    if sdists:
        (root / ".forks" / "cache").mkdir(parents=True)
        for kind in ("sdists", "wheels"):
            (DOWNLOADS / kind).mkdir(parents=True, exist_ok=True)
            (root / ".forks" / "cache" / kind).symlink_to(DOWNLOADS / kind)
    return root


@dataclass
class DemoWorkspace:
    ws: Workspace
    lib: Upstream
    app: Upstream

    def series_dir(self, key: str) -> Path:
        return self.ws.root / "patches" / STACK / key


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def project_entry(key: str, up: Upstream, **extra: str) -> dict[str, str]:
    entry = {
        "key": key, "distribution": up.name, "version": up.version, "commit": up.commit,
        "filename": up.sdist.name, "sha256": sha256(up.sdist), "url": up.sdist.as_uri(),
        "stamp": f"{up.pkg}/_version.py", "git_url": str(up.repo),
    }
    entry.update(extra)
    return entry


def make_demo(tmp_path: Path) -> DemoWorkspace:
    """Two projects: demo-lib (two patches) and demo-app, which pins demo-lib==1.2.3."""
    upstreams = tmp_path / "upstreams"
    lib = make_upstream(upstreams, "demo-lib", "1.2.3")
    app = make_upstream(upstreams, "demo-app", "0.9.0", deps='"demo-lib==1.2.3"')
    root = tmp_path / "toolkit"
    (root / "forks").mkdir(parents=True)
    (root / "forks" / f"{STACK}.toml").write_text(stack_toml(STACK, [
        project_entry("lib", lib),
        project_entry("app", app, requires='requires = ["lib"]\n'
                      'upstream_requires = ["demo-lib==1.2.3"]'),
    ]))
    lib_dir = root / "patches" / STACK / "lib"
    p1 = make_patch(lib.repo, lib_dir, "F1 gate: allow 12", {
        "demo_lib/__init__.py": ("return [9, 10]", "return [9, 10, 12]")},
        "demo_lib/__init__.py: return [9, 10, 12]")
    p2 = make_patch(lib.repo, lib_dir, "F3 guards: drop the 1200 exclusion", {
        "demo_lib/kernel.cuh": (" && __CUDA_ARCH__ < 1200", "  // SM12x: guard removed")},
        "demo_lib/kernel.cuh: // SM12x: guard removed")
    write_series(lib_dir, [p1.name, p2.name])
    app_dir = root / "patches" / STACK / "app"
    p3 = make_patch(app.repo, app_dir, "S1 gate", {
        "demo_app/__init__.py": ("return [9, 10]", "return [9, 10, 12]  # sm12x")},
        "demo_app/__init__.py: return [9, 10, 12]  # sm12x")
    write_series(app_dir, [p3.name])
    return DemoWorkspace(ws=Workspace(root), lib=lib, app=app)


def copy_demo(built: DemoWorkspace, base: Path) -> DemoWorkspace:
    """A copy under ``base`` of a demo workspace ``built`` once: its fork trees, build cache
    and wheels are copies too, so nothing there is built again.  Its upstream repositories
    and sdists are copies a test may change; its declaration (as a build keys its cache on
    it) still names the originals, which no test changes."""
    source = built.ws.root.parent
    shutil.copytree(source, base, symlinks=True, dirs_exist_ok=True)

    def moved(up: Upstream) -> Upstream:
        return dataclasses.replace(up, repo=base / up.repo.relative_to(source),
                                   sdist=base / up.sdist.relative_to(source))

    return DemoWorkspace(ws=Workspace(base / built.ws.root.name), lib=moved(built.lib),
                         app=moved(built.app))
