"""A one-project workspace whose upstream has a newer release on a local package index.

demo-lib 1.2.3 carries four patches; 1.3.0 merged the first identically, fixed the
second in another way, left the third alone and changed the line the fourth edits.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from sm120fork.resolved import ResolvedStack
from sm120fork.workspace import Workspace

from conftest import Upstream, git, make_patch, make_upstream, stack_toml, write_series
from helpers_ws import project_entry, sha256

STACK = "demo"


def stack_of(ws: Workspace, name: str) -> ResolvedStack:
    """Stack ``name`` as the ``bump`` command resolves it (pins that disagree loaded)."""
    return ResolvedStack.named(ws, name, strict=False)
OLD_FILES = {
    "{pkg}/util.py": "def helper():\n    return 1\n",
    "{pkg}/conf.py": "LIMIT = 8\n",
}
NEW_FILES = {
    "{pkg}/__init__.py": """\
        from {pkg}._version import __version__

        def supported_majors():
            return [9, 10, 12]
        """,
    "{pkg}/kernel.cuh": """\
        #if __CUDA_ARCH__ >= 900
        void body() {{}}
        #endif
        """,
    "{pkg}/util.py": "def helper():\n    return 1\n",
    "{pkg}/conf.py": "LIMIT = 4\n",
}


@dataclass
class BumpWorkspace:
    ws: Workspace
    old: Upstream
    new: Upstream
    index_url: str

    @property
    def series_dir(self) -> Path:
        return self.ws.root / "patches" / STACK / "lib"


class _Index(http.server.BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[str, bytes]]] = {}

    def do_GET(self) -> None:
        route = self.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        ctype, data = route
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def package_index(sdists: list[Path], name: str, unhashed: tuple[str, ...] = (),
                  more: dict[str, list[Path]] | None = None) -> Iterator[str]:
    """Serve ``sdists`` (and wheels) under a PEP 691 JSON simple index; yield its URL.

    ``unhashed``: file names the page lists with no sha256 (so nothing can pin them);
    ``more``: other projects' files (name -> files), each on its own page."""
    routes: dict[str, tuple[str, bytes]] = {}
    for project, dists in {name: sdists, **(more or {})}.items():
        files: list[dict[str, object]] = []
        for sdist in dists:
            routes[f"/files/{sdist.name}"] = ("application/octet-stream", sdist.read_bytes())
            files.append({"filename": sdist.name, "url": f"../../files/{sdist.name}",
                          "hashes": {"sha256": sha256(sdist)}})
        if project == name:
            files += [{"filename": n, "url": f"../../files/{n}", "hashes": {}}
                      for n in unhashed]
        routes[f"/simple/{project}/"] = (
            "application/vnd.pypi.simple.v1+json",
            json.dumps({"meta": {"api-version": "1.1"}, "name": project,
                        "files": files}).encode())
    handler = type("Index", (_Index,), {"routes": routes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def make_bump_workspace(tmp_path: Path, index_url: str = "",
                        new_files: dict[str, str] | None = None) -> BumpWorkspace:
    old = make_upstream(tmp_path / "old", "demo-lib", "1.2.3", files=OLD_FILES)
    new = make_upstream(tmp_path / "new", "demo-lib", "1.3.0",
                        files={**NEW_FILES, **(new_files or {})})
    root = tmp_path / "toolkit"
    (root / "forks").mkdir(parents=True)
    entry = project_entry("lib", old)
    entry["url"] = ""  # from the package index, like the real declarations
    (root / "forks" / f"{STACK}.toml").write_text(stack_toml(STACK, [entry]))
    d = root / "patches" / STACK / "lib"
    p1 = make_patch(old.repo, d, "F1 gate: allow 12", {
        "demo_lib/__init__.py": ("return [9, 10]", "return [9, 10, 12]")},
        "demo_lib/__init__.py: return [9, 10, 12]",
        extra_fields="Applied-Upstream: 1.3.0, https://example.invalid/pull/1\n")
    p2 = make_patch(old.repo, d, "F3 guards: drop the 1200 exclusion", {
        "demo_lib/kernel.cuh": (" && __CUDA_ARCH__ < 1200", "  // SM12x: guard removed")},
        "demo_lib/kernel.cuh: // SM12x: guard removed",
        extra_fields="Applied-Upstream: 1.3.0, https://example.invalid/pull/2\n"
                     "Effect: demo_lib/kernel.cuh: re:__CUDA_ARCH__ >= 900\\s*$\n"
                     "Effect-Absent: demo_lib/kernel.cuh: __CUDA_ARCH__ < 1200\n")
    p3 = make_patch(old.repo, d, "S3 util: helper returns 2", {
        "demo_lib/util.py": ("return 1", "return 2  # sm12x")},
        "demo_lib/util.py: return 2  # sm12x")
    p4 = make_patch(old.repo, d, "S4 conf: larger limit", {
        "demo_lib/conf.py": ("LIMIT = 8", "LIMIT = 16  # sm12x")},
        "demo_lib/conf.py: LIMIT = 16  # sm12x")
    write_series(d, [p.name for p in (p1, p2, p3, p4)])
    return BumpWorkspace(ws=Workspace(root), old=old, new=new, index_url=index_url)


@pytest.fixture
def bw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BumpWorkspace]:
    """The bump workspace, its releases served by a package index (a fixture of every
    test module: conftest's ``pytest_plugins``)."""
    monkeypatch.setenv("SM120FORK_TODAY", "2026-11-30")
    workspace = make_bump_workspace(tmp_path)
    with package_index([workspace.old.sdist, workspace.new.sdist], "demo-lib") as url:
        monkeypatch.setenv("SM120FORK_INDEX_URL", url)
        workspace.index_url = url
        yield workspace


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under forks/ and patches/, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes()
            for top in ("forks", "patches") for p in sorted((root / top).rglob("*"))
            if p.is_file()}


#: Non-ASCII, so git writes both as RFC 2047 encoded words (=?UTF-8?q?...?=).
ENCODED_AUTHOR = ("Jürgen Müller", "juergen@example.invalid")


def reauthor_last_patch(upstream_repo: Path, series_dir: Path, subject: str) -> Path:
    """Give the last patch ``subject`` and ENCODED_AUTHOR, as git format-patch writes them."""
    names = (series_dir / "series").read_text().split()
    git(upstream_repo, "checkout", "-q", "scratch")
    message = git(upstream_repo, "log", "-1", "--format=%B")
    body = message.partition("\n")[2]
    name, email = ENCODED_AUTHOR
    git(upstream_repo, "commit", "-q", "--amend", "--author", f"{name} <{email}>",
        "-m", f"{subject}\n{body}")
    (series_dir / names[-1]).unlink()
    out = git(upstream_repo, "format-patch", "--zero-commit", "--no-signature", "--full-index",
              "--no-numbered", f"--start-number={len(names)}", "-o", str(series_dir), "-1")
    patch = Path(out)
    assert "=?UTF-8?q?" in patch.read_text(), "git did not encode the header"
    write_series(series_dir, [*names[:-1], patch.name])
    return patch


def hint_commands(hint: str | None) -> list[str]:
    """The commands a hint prints, in order (each between backticks)."""
    return re.findall(r"`([^`]+)`", hint or "")


def run_hint(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a hint's command exactly as printed; ``python`` is this test's interpreter."""
    shell = re.sub(r"(^|&& )python -m ", rf"\1{shlex.quote(sys.executable)} -m ", command)
    return subprocess.run(shell, shell=True, cwd=cwd, capture_output=True, text=True,
                          check=False, env={**os.environ, "COLUMNS": "1000"})


def commit_checkout(root: Path) -> None:
    """Make the toolkit root a git checkout, as a clone is, with everything committed."""
    (root / ".gitignore").write_text(".forks/\nwheels/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "checkout")


def pack_wheel(upstream: Upstream, out: Path) -> Path:
    """The upstream release as the package index publishes it: a pure-Python wheel of its
    package (:func:`pack_release` of its files as committed)."""
    files = {p.relative_to(upstream.repo).as_posix(): p.read_text()
             for p in sorted((upstream.repo / upstream.pkg).rglob("*")) if p.is_file()}
    return pack_release(out, upstream.name, upstream.version, files, [])


def pack_release(out: Path, name: str, version: str, files: dict[str, str],
                 requires: list[str]) -> Path:
    """A release as the package index publishes it when it has no sdist: a pure-Python
    wheel of ``files`` whose METADATA states ``requires`` (``wheel pack``, no network)."""
    pkg = name.replace("-", "_")
    root = out / f"src-{pkg}-{version}" / f"{pkg}-{version}"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    info = root / f"{pkg}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("\n".join([
        "Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires)]) + "\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                "Tag: py3-none-any\n")
    subprocess.run([sys.executable, "-m", "wheel", "pack", "--dest-dir", str(out), str(root)],
                   check=True, capture_output=True, env={"SOURCE_DATE_EPOCH": "1700000000"})
    return out / f"{pkg}-{version}-py3-none-any.whl"


def git_release(repo: Path, files: dict[str, str], message: str) -> Path:
    """A git repository ``repo`` whose one commit (``message``) holds ``files``."""
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return repo


def sglang_toolkit(tmp_path: Path, stack: str, toml: str, files: dict[str, str],
                   gate_file: str, extra_fields: str = "") -> Path:
    """A toolkit checkout (``tmp_path/toolkit``) whose stack ``stack`` (``toml``) carries
    one SGLang patch, G1 (``(9, 10)`` -> ``(9, 10, 12)`` in ``gate_file``), made on the
    upstream repository as the series author has it (``files`` under python/), and an
    empty FlashInfer series."""
    repo = git_release(tmp_path / "sglang-repo",
                       {f"python/{rel}": text for rel, text in files.items()}, "release 0.5.23")
    root = tmp_path / "toolkit"
    (root / "forks").mkdir(parents=True)
    (root / "forks" / f"{stack}.toml").write_text(toml)
    write_series(root / "patches" / stack / "flashinfer", [])
    series = root / "patches" / stack / "sglang"
    patch = make_patch(repo, series, "G1 layer_boundary: allow the fused path on 12", {
        f"python/{gate_file}": ("(9, 10)", "(9, 10, 12)  # sm12x")},
        f"python/{gate_file}: (9, 10, 12)  # sm12x", extra_fields=extra_fields)
    write_series(series, [patch.name])
    return root


def wheel_project(stack: str, key: str, distribution: str, version: str, wheel: Path, *,
                  package_root: str = ".", more: tuple[str, ...] = (),
                  url: bool = False) -> list[str]:
    """The declaration's lines of project ``key``, a ``wheel`` source pinning ``wheel``
    (``more``: its other keys), and a blank line."""
    return [f"[projects.{key}]", f'distribution = "{distribution}"', f'version = "{version}"',
            'local_label = "sm120.1"', f'package_root = "{package_root}"',
            f'series = "patches/{stack}/{key}"', 'source = "wheel"', *more, "",
            f"[[projects.{key}.wheels]]", f'filename = "{wheel.name}"',
            f'sha256 = "{sha256(wheel)}"', *([f'url = "{wheel.as_uri()}"'] if url else []), ""]


def sglang_toml(stack: str, sglang: Path, flashinfer: Path, *, requires_dist: str,
                description: str = "", flashinfer_url: bool = False,
                comments: dict[str, str] | None = None) -> str:
    """A stack shaped like sglang-0.5.23: sglang 0.5.23 (pinning FlashInfer by
    ``requires_dist``) on the ``layer_boundary`` layout and flashinfer-python 0.7.2 used as
    published, each a ``wheel`` source of the wheel given; ``comments``: a comment line
    above the first line that starts with each key."""
    lines = ["[stack]", f'name = "{stack}"', "default = true",
             *([f'description = "{description}"'] if description else []), "",
             *wheel_project(stack, "flashinfer", "flashinfer-python", "0.7.2", flashinfer,
                            url=flashinfer_url),
             *wheel_project(stack, "sglang", "sglang", "0.5.23", sglang, package_root="python",
                            more=('requires = ["flashinfer"]',
                                  f'upstream_requires = ["{requires_dist}"]',
                                  'layout = "layer_boundary"'))]
    for key, comment in (comments or {}).items():
        at = next(i for i, line in enumerate(lines) if line.startswith(key))
        lines.insert(at, f"# {comment}")
    return "\n".join(lines[:-1]) + "\n"


def count_series_loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every series folder read from now on, by any toolkit module that imported
    ``load_series`` (the list grows as they are read)."""
    import sys as _sys

    from sm120fork.patch import series as series_module

    loaded: list[Path] = []
    real = series_module.load_series

    def counting(directory: Path) -> series_module.Series:
        loaded.append(directory)
        return real(directory)

    for name, module in list(_sys.modules.items()):
        if (name.startswith("sm120fork.") and module is not series_module
                and getattr(module, "load_series", None) is real):
            monkeypatch.setattr(module, "load_series", counting)
    return loaded
