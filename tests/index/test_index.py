"""`index`: the package index of our wheels, served from a folder on localhost and installed
from by pip in fresh venvs exactly as its landing page writes each route.

The wheels are small stand-ins with the real names and versions of each stack's build (no
stack is built here); a second folder on the same server stands in for the public index
(stock sglang, the public FlashInfer releases, torch), so that pip chooses between ours
and the public release as it would on a user's machine, offline.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from packaging.tags import sys_tags

from helpers_manifest import entry, write_manifest
from sm120fork.cli.main import main
from sm120fork.errors import ArtifactCheckError, ConfigError, UsageError
from sm120fork.index import write_index
from sm120fork.workspace import Workspace

from helpers_ws import checkout_copy

HERE_TAG = next(iter(sys_tags()))
OTHER_TAG = f"{HERE_TAG.interpreter}-{HERE_TAG.abi}-manylinux_2_34_" + (
    "aarch64" if not HERE_TAG.platform.endswith("aarch64") else "x86_64")


def make_wheel(folder: Path, name: str, version: str, *, tag: str = "py3-none-any",
               requires: tuple[str, ...] = (), extra: dict[str, str] | None = None) -> Path:
    """A tiny installable wheel, the same bytes each time."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-{tag}.whl"
    files = {
        f"{name.replace('-', '_')}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Requires-Python: >=3.10\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{dist}.dist-info/WHEEL": (f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                    f"{'true' if tag == 'py3-none-any' else 'false'}\n"
                                    f"Tag: {tag}\n"),
        f"{dist}.dist-info/RECORD": "",
        **(extra or {}),
    }
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(zipfile.ZipInfo(member, (2000, 1, 1, 0, 0, 0)), text)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def aot_wheel(folder: Path, version: str, flashinfer: Path) -> Path:
    """An AOT wheel (no modules) whose manifest names the FlashInfer wheel it was built for."""
    ours = flashinfer.name.split("-")[1]
    built_for = {"distribution": "flashinfer-python", "version": ours,
                 "wheel": flashinfer.name, "sha256": _sha256(flashinfer), "tree": None,
                 "patched_commit": None, "upstream_version": "0", "series_digest": "0"}
    manifest = {"version": version, "flashinfer": built_for, "modules": {}}
    return make_wheel(folder, "sm120fork-flashinfer-aot", version,
                      requires=(f"flashinfer-python=={ours}",),
                      extra={"sm120fork_flashinfer_aot/manifest.json": json.dumps(manifest)})


def _publish(folder: Path, stack: str, *wheels: tuple[Path, bool]) -> None:
    """``manifest.json`` of a build that published ``wheels`` (path, used as published)."""
    entries = []
    for wheel, as_published in wheels:
        name, version = wheel.name.split("-")[:2]
        entries.append(entry(name, distribution=name.replace("_", "-"), version=version,
                             upstream_version=version.split("+")[0], wheel=wheel.name,
                             sha256=_sha256(wheel), used_as_published=as_published))
    write_manifest(folder, stack, *entries)


def built_stacks(root: Path) -> None:
    """Each stack's folder as its build leaves it, with the real names and versions."""
    wheels = root / "wheels"
    default = wheels / "sglang-0.5.10"
    flashinfer = make_wheel(default, "flashinfer-python", "0.6.7.post3+sm120.1",
                            requires=("torch",))
    _publish(default, "sglang-0.5.10", (flashinfer, False),
             (make_wheel(default, "sglang", "0.5.10.post1+sm120.1", requires=(
                 "flashinfer_python==0.6.7.post3", "torch==2.9.1")), False))
    aot_wheel(wheels / "aot" / "sglang-0.5.10", "0.6.7.post3+sm120.1.cu130", flashinfer)
    today = wheels / "sglang-0.5.23"
    published = make_wheel(today, "flashinfer-python", "0.7.2")
    patched = [make_wheel(today, "sglang", "0.5.23+sm120.1", tag=tag,
                          requires=("flashinfer_python==0.7.2",))
               for tag in (str(HERE_TAG), OTHER_TAG)]
    _publish(today, "sglang-0.5.23", (published, True), *((w, False) for w in patched))
    plugin = make_wheel(today / "plugin", "sm120fork-sglang-plugin", "0.5.23+sm120.1")
    (today / "plugin" / "plugin.json").write_text(json.dumps({
        "wheel": plugin.name, "sha256": _sha256(plugin), "sglang": "0.5.23", "hooks": []}))
    aot_wheel(wheels / "aot" / "sglang-0.5.23", "0.7.2+cu130", published)
    newer = wheels / "flashinfer-0.7.4"
    _publish(newer, "flashinfer-0.7.4", (make_wheel(
        newer, "flashinfer-python", "0.7.4+sm120.1", requires=("torch",)), False))


def public_index(folder: Path) -> None:
    """A PEP 503 stand-in of the public index: the public releases our builds replace."""
    for name, version, requires in (
            ("sglang", "0.5.10.post1", ()), ("sglang", "0.5.23", ("flashinfer_python==0.7.2",)),
            ("flashinfer-python", "0.6.7.post3", ()), ("flashinfer-python", "0.7.2", ()),
            ("torch", "2.9.1", ())):
        wheel = make_wheel(folder / "files", name, version, requires=requires)
        page = folder / "simple" / name / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        with page.open("a") as f:
            f.write(f'<a href="../../files/{wheel.name}#sha256={_sha256(wheel)}">'
                    f"{wheel.name}</a>\n")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workspace, str, Path]]:
    """A checkout with every stack built (stand-ins), and a server on 127.0.0.1 for its
    ``site/`` (the index, once written) and ``public/`` (the public stand-in)."""
    base = tmp_path_factory.mktemp("index")
    ws = Workspace(checkout_copy(base, sdists=False))
    built_stacks(ws.root)
    web = base / "web"
    public_index(web / "public")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=web))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ws, f"http://127.0.0.1:{server.server_address[1]}/", web
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def routes_of(landing: str) -> dict[tuple[str, str], str]:
    """(stack, route) -> the pip line, as the landing page writes them."""
    found = {}
    for section in re.split(r'(?=<h2 id=")', landing)[1:]:
        stack = re.match(r'<h2 id="([^"]+)"', section)
        assert stack is not None
        for route, line in re.findall(r"<tr><td>([^<]+)</td><td><code>([^<]+)</code>", section):
            found[stack.group(1), html.unescape(route)] = html.unescape(line)
    return found


def _installed(venv: Path) -> set[tuple[str, str]]:
    site = next((venv / "lib").glob("python3*/site-packages"))
    metas = [p.read_text() for p in site.glob("*.dist-info/METADATA")]
    return {(re.findall(r"^Name: (.+)$", m, re.M)[0], re.findall(r"^Version: (.+)$", m, re.M)[0])
            for m in metas}


def _pip_env(**extra: str) -> dict[str, str]:
    """This process's environment less the machine's pip configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_CACHE_DIR": "1", **extra}


def install_line(line: str, venv: Path, env: dict[str, str]) -> set[tuple[str, str]]:
    """Run a landing page's ``pip install ...`` line into a fresh venv; what it installed."""
    argv = shlex.split(line)
    assert argv[:2] == ["pip", "install"]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-compile", *argv[2:]], check=True, env=env)
    return _installed(venv)


EXPECTED = {
    ("sglang-0.5.10", "patched wheels"): {
        ("flashinfer-python", "0.6.7.post3+sm120.1"), ("sglang", "0.5.10.post1+sm120.1"),
        ("torch", "2.9.1")},
    ("sglang-0.5.10", "patched wheels + AOT wheel (prebuilt kernels, no nvcc)"): {
        ("flashinfer-python", "0.6.7.post3+sm120.1"), ("sglang", "0.5.10.post1+sm120.1"),
        ("torch", "2.9.1"), ("sm120fork-flashinfer-aot", "0.6.7.post3+sm120.1.cu130")},
    ("sglang-0.5.23", "patched wheels"): {
        ("flashinfer-python", "0.7.2"), ("sglang", "0.5.23+sm120.1")},
    ("sglang-0.5.23", "stock SGLang + plugin"): {
        ("flashinfer-python", "0.7.2"), ("sglang", "0.5.23"),
        ("sm120fork-sglang-plugin", "0.5.23+sm120.1")},
    ("flashinfer-0.7.4", "patched wheels"): {
        ("flashinfer-python", "0.7.4+sm120.1"), ("torch", "2.9.1")},
}


@pytest.mark.slow
def test_each_route_installs_from_the_served_index_as_its_landing_page_writes_it(
        served: tuple[Workspace, str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every line of the landing page, pasted into a fresh venv whose pip sees the index
    and the public stand-in: our builds where the route wants them (over the same public
    version), stock SGLang with the plugin, the public FlashInfer a stack ships as
    published, each dependency from the public side."""
    ws, url, web = served
    assert main(["--root", str(ws.root), "index", "--url", f"{url}site",
                 "--out", str(web / "site")]) == 0
    printed = capsys.readouterr().out
    routes = routes_of((web / "site" / "index.html").read_text())
    assert set(routes) == set(EXPECTED)
    env = _pip_env(PIP_INDEX_URL=f"{url}public/simple/")
    for n, (key, line) in enumerate(sorted(routes.items())):
        assert f"{key[0]}, {key[1]}: {line}\n" in printed  # what `index` prints is the page's
        assert install_line(line, tmp_path / f"venv{n}", env) == EXPECTED[key], (key, line)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_same_wheels_give_a_byte_identical_index(served: tuple[Workspace, str, Path],
                                                     tmp_path: Path) -> None:
    ws, url, _ = served
    first = write_index(ws, url=url, out=tmp_path / "one").out
    for wheel in ws.wheels_dir.rglob("*.whl"):  # copied, touched: no time leaks in
        os.utime(wheel, (1, 1))
    second = write_index(ws, url=url, out=tmp_path / "two").out
    assert _tree(first) == _tree(second)
    assert len(_tree(first)) > 10


def test_only_our_builds_are_served_each_with_its_digest_and_metadata(
        served: tuple[Workspace, str, Path], tmp_path: Path) -> None:
    """Never a public version under our name: FlashInfer 0.7.2 as published and an AOT
    wheel without our label are left out, each with a line saying why; every file
    served has its sha256, Requires-Python and METADATA (PEP 658) as pip checks them."""
    ws, url, _ = served
    index = write_index(ws, url=url, out=tmp_path / "site")
    files = sorted(p.name for p in (index.out / "files").glob("*.whl"))
    assert len(files) == 7
    assert all("+sm120.1" in f for f in files)
    left = "\n".join(index.notes)
    assert "flashinfer_python-0.7.2-py3-none-any.whl: version 0.7.2 has no local label" in left
    assert "sm120fork_flashinfer_aot-0.7.2+cu130-py3-none-any.whl: version 0.7.2+cu130" in left
    page = json.loads((index.out / "simple" / "flashinfer-python" / "index.json").read_text())
    assert page["versions"] == ["0.6.7.post3+sm120.1", "0.7.4+sm120.1"]
    for f in page["files"]:
        wheel = index.out / "files" / f["filename"]
        assert f["hashes"]["sha256"] == _sha256(wheel)
        meta = Path(f"{wheel}.metadata").read_bytes()
        assert f["core-metadata"]["sha256"] == hashlib.sha256(meta).hexdigest()
        assert with_zip(wheel) == meta
        assert f["requires-python"] == ">=3.10"
    link = (index.out / "simple" / "sglang" / "index.html").read_text()
    assert 'data-requires-python="&gt;=3.10"' in link
    assert "data-core-metadata=\"sha256=" in link
    landing = (index.out / "index.html").read_text()
    assert "sglang-0.5.10.post1+sm120.1-py3-none-any.whl</td><td>&gt;=3.10 (py3)</td>" \
           "<td>==2.9.1</td><td>not pinned by the wheel</td>" in landing
    assert "CUDA 13.0" in landing  # the AOT wheel's cu130


def with_zip(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith("dist-info/METADATA")))


def test_a_wheel_that_differs_from_its_build_record_is_refused(tmp_path: Path) -> None:
    ws = Workspace(checkout_copy(tmp_path, sdists=False))
    built_stacks(ws.root)
    wheel = next((ws.wheels_dir / "flashinfer-0.7.4").glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(ArtifactCheckError) as err:
        write_index(ws, out=tmp_path / "site")
    assert err.value.where == str(wheel)
    assert not (tmp_path / "site").exists()


def test_an_aot_wheel_built_for_another_flashinfer_wheel_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack rebuilt after its AOT wheel: the AOT wheel's manifest names a FlashInfer wheel
    the build no longer publishes, so it is not served and the page offers no AOT route."""
    monkeypatch.delenv("SM120FORK_FRONT_DOOR", raising=False)  # hints: python -m sm120fork
    ws = Workspace(checkout_copy(tmp_path, sdists=False))
    built_stacks(ws.root)
    other = make_wheel(tmp_path / "old", "flashinfer-python", "0.6.7.post3+sm120.1",
                       requires=("torch", "numpy"))
    stale = aot_wheel(ws.wheels_dir / "aot" / "sglang-0.5.10", "0.6.7.post3+sm120.1.cu130",
                      other)
    index = write_index(ws, out=tmp_path / "site")
    assert (f"sglang-0.5.10: {stale.name}: built for a FlashInfer wheel this build did not "
            f"publish ({other.name}, sha256 {_sha256(other)[:12]}...); not served: rebuild it "
            "with `python -m sm120fork build-aot --stack sglang-0.5.10`") in index.notes
    assert not (index.out / "files" / stale.name).exists()
    assert "AOT wheel" not in (index.out / "index.html").read_text()


def test_nothing_built_or_a_url_pip_cannot_read_is_refused_with_the_command_to_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SM120FORK_FRONT_DOOR", raising=False)  # hints: python -m sm120fork
    ws = Workspace(checkout_copy(tmp_path, sdists=False))
    with pytest.raises(ConfigError) as nothing:
        write_index(ws, out=tmp_path / "site")
    assert nothing.value.fix == "python -m sm120fork build --all-stacks"
    with pytest.raises(UsageError) as url:
        write_index(ws, url="owner.github.io/repo", out=tmp_path / "site")
    assert url.value.fix == "python -m sm120fork index --url https://OWNER.github.io/REPO/"
    assert not (tmp_path / "site").exists()


@pytest.mark.network
def test_with_the_public_index_beside_it_pip_chooses_our_build(
        served: tuple[Workspace, str, Path], tmp_path: Path) -> None:
    """SGLang's own pin (``flashinfer_python==0.6.7.post3``) with the public index as the
    other source: pip's report names our build, from our index; without our index the
    same request gets the public release, so the choice was a real one."""
    ws, url, _ = served
    site = write_index(ws, url=f"{url}site", out=served[2] / "site")

    def chosen(*extra: str) -> dict[str, str]:
        report = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
             "--no-deps", "--quiet", "--report", "-", *extra, "flashinfer-python==0.6.7.post3"],
            check=True, capture_output=True, text=True,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}).stdout
        (item,) = json.loads(report)["install"]
        return {"version": item["metadata"]["version"], "url": item["download_info"]["url"]}

    ours = chosen("--extra-index-url", f"{site.url}simple/")
    assert ours["version"] == "0.6.7.post3+sm120.1"
    assert ours["url"].startswith(f"{url}site/files/")
    assert chosen()["version"] == "0.6.7.post3"
