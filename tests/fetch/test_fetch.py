from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from packaging.version import Version

from sm120fork.errors import ChecksumError, SourceError, UnsafeArchiveError
from sm120fork.fetch.archive import safe_extract
from sm120fork.fetch.index import download_pinned, find_sdist, project_page
from sm120fork.fetch.kinds import KINDS

from helpers_ws import STACK, make_demo, sha256


def tarball(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for m in members:
            data = b"x" if m.isfile() else None
            if data:
                m.size = len(data)
            tf.addfile(m, io.BytesIO(data) if data else None)
    return path


def info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type = kind
    m.linkname = link
    return m


@pytest.mark.parametrize("members", [
    [info("pkg-1/a.py"), info("/etc/evil")],
    [info("pkg-1/a.py"), info("pkg-1/../../evil")],
    [info("pkg-1/a.py"), info("pkg-1/link", tarfile.SYMTYPE, "../../outside")],
    [info("pkg-1/a.py"), info("pkg-1/abs", tarfile.SYMTYPE, "/etc/passwd")],
    [info("pkg-1/a.py"), info("pkg-1/hard", tarfile.LNKTYPE, "../x")],
    [info("pkg-1/a.py"), info("pkg-1/dev", tarfile.CHRTYPE)],
])
def test_escaping_entries_are_refused_before_writing(tmp_path: Path,
                                                     members: list[tarfile.TarInfo]) -> None:
    archive = tarball(tmp_path / "bad.tar.gz", members)
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError):
        safe_extract(archive, dest)
    assert not any(dest.rglob("*"))
    assert not (tmp_path / "evil").exists()


def test_a_link_through_a_link_is_refused_by_the_data_filter(tmp_path: Path) -> None:
    """``d/l -> ..`` stays inside; ``d/l/l2 -> ../..`` only leaves once ``d/l`` exists."""
    archive = tarball(tmp_path / "chain.tar.gz", [
        info("pkg-1/d", tarfile.DIRTYPE), info("pkg-1/d/l", tarfile.SYMTYPE, ".."),
        info("pkg-1/d/l/l2", tarfile.SYMTYPE, "../..")])
    with pytest.raises(UnsafeArchiveError, match="outside the destination"):
        safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "l2").exists()


def test_links_inside_the_tree_are_fine(tmp_path: Path) -> None:
    archive = tarball(tmp_path / "ok.tar.gz", [
        info("pkg-1/a.py"), info("pkg-1/sub", tarfile.DIRTYPE),
        info("pkg-1/sub/l", tarfile.SYMTYPE, "../a.py")])
    top = safe_extract(archive, tmp_path / "out")
    assert top.name == "pkg-1"
    assert (top / "sub" / "l").resolve() == (top / "a.py").resolve()


def test_download_checks_sha256_and_keeps_nothing_on_mismatch(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    cache = tmp_path / "cache"
    got = download_pinned(project, project.sdist_pin, cache)
    assert sha256(got) == project.sdist_pin.sha256
    bad = replace(project, sdist=replace(project.sdist_pin, sha256="0" * 64))
    got.unlink()
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        download_pinned(bad, bad.sdist_pin, cache)
    assert list(cache.iterdir()) == []


class _Index(BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}
    yanked: ClassVar[set[str]] = set()

    def do_GET(self) -> None:
        ctype = "application/octet-stream"
        if self.path.startswith("/simple/demo-lib/"):
            ctype = "application/vnd.pypi.simple.v1+json"
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": "demo-lib", "files": [
                {"filename": name, "url": f"/files/{name}", "yanked": name in self.yanked,
                 "hashes": {"sha256": __import__("hashlib").sha256(data).hexdigest()}}
                for name, data in self.files.items()]}).encode()
        elif self.path.startswith("/files/") and self.path[7:] in self.files:
            body = self.files[self.path[7:]]
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Index]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SM120FORK_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    yield _Index
    server.shutdown()
    server.server_close()


def test_index_resolution_and_unknown_version(tmp_path: Path, index: type[_Index]) -> None:
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    project = replace(project, sdist=replace(project.sdist_pin, url=""))
    index.files = {project.sdist_pin.filename: demo.lib.sdist.read_bytes()}
    progress: list[int] = []
    got = download_pinned(project, project.sdist_pin, tmp_path / "cache",
                          lambda done, total: progress.append(done))
    assert sha256(got) == project.sdist_pin.sha256
    assert progress[-1] == got.stat().st_size
    missing = replace(project, version="9.9.9", sdist=replace(project.sdist_pin,
                                                             filename="demo_lib-9.9.9.tar.gz"))
    with pytest.raises(SourceError, match=r"not on the package index.*sdists there: 1\.2\.3"):
        download_pinned(missing, missing.sdist_pin, tmp_path / "cache2")
    index.files = {project.sdist_pin.filename: b"tampered"}
    with pytest.raises(ChecksumError) as err:
        download_pinned(project, project.sdist_pin, tmp_path / "cache3")
    listed = hashlib.sha256(b"tampered").hexdigest()
    assert f"the index lists sha256 {listed} " in str(err.value)  # both digests in full
    assert f"the pin says {project.sdist_pin.sha256}" in str(err.value)


def test_index_skips_yanked_files_and_sorts_versions_as_versions(
        tmp_path: Path, index: type[_Index], caplog: pytest.LogCaptureFixture) -> None:
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    index.files = {"demo_lib-1.2.3.tar.gz": b"a", "demo_lib-1.10.0.tar.gz": b"b",
                   "demo_lib-1.9.0.tar.gz": b"c", "demo_lib-1.10.0-py3-none-any.whl": b"d"}
    index.yanked = {"demo_lib-1.9.0.tar.gz"}
    caplog.set_level(logging.INFO, logger="sm120fork")
    try:
        page = project_page(project)
        assert [str(v) for v in page.sdists(project)] == ["1.2.3", "1.10.0"]
        assert "skipping demo_lib-1.9.0.tar.gz: yanked" in caplog.text
        assert find_sdist(project, Version("1.10.0")).sha256 == hashlib.sha256(b"b").hexdigest()
        with pytest.raises(SourceError,
                           match=r"1\.9\.0 is yanked.*recent sdists: 1\.2\.3, 1\.10\.0"):
            find_sdist(project, Version("1.9.0"))
    finally:
        index.yanked = set()


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def folder_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A PEP 503 index that is only a folder (``simple/<name>/index.html`` and the files),
    served on 127.0.0.1 by http.server, and named only in a pip configuration file: no
    other index, no toolkit variable."""
    root = tmp_path / "index"
    (root / "simple").mkdir(parents=True)
    (root / "files").mkdir()
    handler = functools.partial(_QuietFiles, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/simple/"
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nindex-url = {url}\nextra-index-url =\n")
    for var in ("SM120FORK_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    yield root, url
    server.shutdown()
    server.server_close()


def _publish(root: Path, name: str, files: dict[str, bytes], *, hashed: bool = True) -> None:
    page = root / "simple" / name
    page.mkdir(parents=True, exist_ok=True)
    links = []
    for filename, data in files.items():
        (root / "files" / filename).write_bytes(data)
        frag = f"#sha256={hashlib.sha256(data).hexdigest()}" if hashed else ""
        links.append(f'<a href="../../files/{filename}{frag}">{filename}</a>')
    (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "<br>\n".join(links)
                                     + "\n</body></html>\n")


def test_downloads_use_the_index_named_in_pips_configuration(
        tmp_path: Path, folder_index: tuple[Path, str]) -> None:
    root, url = folder_index
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    project = replace(project, sdist=replace(project.sdist_pin, url=""))  # from the index
    _publish(root, "demo-lib", {project.sdist_pin.filename: demo.lib.sdist.read_bytes(),
                                "demo_lib-1.10.0.tar.gz": b"newer"})
    page = project_page(project)
    assert page.url == f"{url}demo-lib/"
    assert [str(v) for v in page.sdists(project)] == ["1.2.3", "1.10.0"]
    got = download_pinned(project, project.sdist_pin, tmp_path / "cache")
    assert sha256(got) == project.sdist_pin.sha256
    # A pin the index contradicts is refused before anything is downloaded.
    wrong = replace(project, sdist=replace(project.sdist_pin, sha256="0" * 64))
    with pytest.raises(ChecksumError, match="the pin says 0000"):
        download_pinned(wrong, wrong.sdist_pin, tmp_path / "cache-wrong")
    assert not (tmp_path / "cache-wrong").exists() or not any(
        (tmp_path / "cache-wrong").iterdir())
    # An index that lists no sha256: the download is checked against the pin, and
    # nothing is kept.
    _publish(root, "demo-lib", {project.sdist_pin.filename: b"tampered"}, hashed=False)
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        download_pinned(project, project.sdist_pin, tmp_path / "cache-tampered")
    assert list((tmp_path / "cache-tampered").iterdir()) == []


def test_an_unreachable_index_in_pips_configuration_is_named(
        tmp_path: Path, folder_index: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    (tmp_path / "pip.conf").write_text("[global]\nindex-url = http://127.0.0.1:9/simple/\n"
                                       "extra-index-url =\nretries = 0\ntimeout = 5\n")
    with pytest.raises(SourceError, match=r"cannot read demo-lib's page") as err:
        project_page(project)
    assert err.value.where == "http://127.0.0.1:9/simple/demo-lib/"
    assert "pip config list" in (err.value.fix or "")


def test_the_download_section_find_links_and_pip_variables_are_honoured(
        tmp_path: Path, folder_index: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``pip download`` reads its configuration: the ``download`` section over
    ``global``, ``PIP_*`` variables over both, and the find-links searched beside the
    index (a folder here)."""
    root, url = folder_index
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    _publish(root, "demo-lib", {project.sdist_pin.filename: demo.lib.sdist.read_bytes()})
    links = tmp_path / "links"
    links.mkdir()
    (links / "demo_lib-1.10.0.tar.gz").write_bytes(b"found beside the index")
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = http://127.0.0.1:9/simple/\nextra-index-url =\n"
        f"[download]\nindex-url = {url}\nfind-links = {links}\n")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    page = project_page(project)
    assert page.url == f"{url}demo-lib/"
    assert [str(v) for v in page.sdists(project)] == ["1.2.3", "1.10.0"]
    assert page.sdists(project)[Version("1.10.0")].url == (links / "demo_lib-1.10.0.tar.gz"
                                                           ).as_uri()
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(SourceError, match=r"cannot read demo-lib's page") as err:
        project_page(project)
    assert err.value.where == "http://127.0.0.1:9/simple/demo-lib/"


def test_a_pip_configuration_the_index_cannot_use_is_named_and_pinned_files_need_none(
        tmp_path: Path, folder_index: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    for var in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    local = f"[global]\nindex-url = {folder_index[1]}\n"
    cases = {local + "cert = {tmp}/missing.pem\n": r"cannot be loaded \(cert '.*missing\.pem'",
             local + "default-timeout = soon\n": r"cannot be read: .*default-timeout.*'soon'"}
    for number, (text, said) in enumerate(cases.items()):
        config = tmp_path / f"pip-{number}.conf"
        config.write_text(text.format(tmp=tmp_path))
        monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
        with pytest.raises(SourceError, match=said) as err:
            project_page(project)
        assert "pip config list" in (err.value.fix or "")
        # A pinned file: URL is read as it is, whatever pip's configuration says.
        got = download_pinned(project, project.sdist_pin, tmp_path / f"cache-{number}")
        assert sha256(got) == project.sdist_pin.sha256


class _Proxy(_Index):
    """A forward proxy in front of :class:`_Index`: it alone knows ``index.invalid``."""

    def do_GET(self) -> None:
        self.path = self.path.removeprefix("http://index.invalid")
        super().do_GET()


@pytest.mark.parametrize("where", ["pip.conf", "HTTP_PROXY"])
def test_the_index_is_read_and_downloaded_through_the_proxy(
        tmp_path: Path, folder_index: tuple[Path, str], monkeypatch: pytest.MonkeyPatch,
        where: str) -> None:
    """``proxy`` in pip's configuration, or the proxy variables, carry the pages and the
    files (here the only way to the index)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_port}"
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    project = replace(project, sdist=replace(project.sdist_pin, url=""))
    _Proxy.files = {project.sdist_pin.filename: demo.lib.sdist.read_bytes()}
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = http://index.invalid/simple/\nextra-index-url =\n"
        "trusted-host = index.invalid\n"
        + (f"proxy = {proxy}\n" if where == "pip.conf" else ""))
    for var in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    if where == "HTTP_PROXY":
        monkeypatch.setenv("HTTP_PROXY", proxy)
    try:
        assert [str(v) for v in project_page(project).sdists(project)] == ["1.2.3"]
        got = download_pinned(project, project.sdist_pin, tmp_path / "cache")
        assert sha256(got) == project.sdist_pin.sha256
    finally:
        server.shutdown()
        server.server_close()


def test_git_source_refuses_wrong_commit(tmp_path: Path) -> None:
    demo = make_demo(tmp_path)
    project = demo.ws.stack(STACK).project("lib")
    work = tmp_path / "work" / "lib"
    work.parent.mkdir()
    assert KINDS["git"].init_tree(project, work, demo.ws) == demo.lib.commit
    bogus = replace(project, git=replace(project.git_pin, commit="1" * 40))
    with pytest.raises(SourceError, match="cannot fetch commit 1111"):
        KINDS["git"].init_tree(bogus, tmp_path / "work" / "other", demo.ws)


def test_every_source_kind_is_one_entry_of_the_registry_and_answers_for_itself(
        tmp_path: Path) -> None:
    """What differs between kinds is the registry's: each name a declaration accepts is
    there, a build of each downloads with that kind (package/kinds.py asks it), and status
    asks it what it would download instead of naming kinds itself."""
    import dataclasses

    from sm120fork.declare import KIND_PINS, SOURCE_KINDS
    from sm120fork.fetch import kinds
    from sm120fork.package.kinds import kind_for
    from sm120fork.patch.series import load_series
    from sm120fork.workspace import Workspace

    assert set(kinds.KINDS) == set(SOURCE_KINDS) == set(KIND_PINS)
    demo = make_demo(tmp_path)
    lib = demo.ws.stack(STACK).project("lib")
    series = load_series(demo.ws.series_dir(lib))
    assert series.patches
    for name in SOURCE_KINDS:
        build = kind_for(dataclasses.replace(lib, source=name), series)
        assert build.source.name == name  # its build cache is keyed by the kind
        assert build.source is kinds.source_kind(name)
    kind = kinds.source_kind(lib.source)
    ws = Workspace(tmp_path)
    assert kind.missing(lib, ws) == [lib.sdist_pin.filename]
    ws.sdist_cache.mkdir(parents=True)
    (ws.sdist_cache / lib.sdist_pin.filename).write_bytes(b"cached")
    assert kind.missing(lib, ws) == []
    assert kinds.source_key(lib) == f"sdist:{lib.sdist_pin.sha256}"
    with pytest.raises(ValueError, match="unknown source kind 'svn'"):
        kinds.source_kind("svn")
