"""``index``: a static package index of our wheels (PEP 503/691/700, METADATA beside each
per PEP 658/714) with a landing page of pip lines; relative links, reproducible bytes.  It
serves each stack's built, plugin and AOT wheels, checked against their build's record, and
only ours (a local label of the stack, ``+sm120.1``): a public release served from here
would go under our name."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import BytesParser
from html import escape
from pathlib import Path
from urllib.parse import urlsplit

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from sm120fork import manifest as manifest_file
from sm120fork.aot import wheel as aot_wheel
from sm120fork.aot.pipeline import default_out as aot_folder
from sm120fork.declare import Stack
from sm120fork.errors import ArtifactCheckError, ConfigError, UsageError
from sm120fork.manifest import Manifest
from sm120fork.package.publish import Route, file_path, index_routes
from sm120fork.plugin.build import PLUGIN_DIR, PublishedPlugin
from sm120fork.util.files import atomic_copy, dist_info, sha256_file, staged_dir
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace


@dataclass(frozen=True, kw_only=True)
class Served:
    path: Path
    project: str
    version: Version
    sha256: str
    size: int
    metadata: bytes
    requires_python: str
    python: str
    torch: str
    cuda: str

    @property
    def filename(self) -> str:
        return self.path.name


@dataclass(frozen=True, kw_only=True)
class StackWheels:
    stack: Stack
    manifest: Manifest
    plugin: PublishedPlugin | None
    served: tuple[Served, ...]
    aot: Served | None
    left_out: tuple[str, ...]


def _ours(stack: Stack, version: Version) -> bool:
    local = f"{version.local}."
    return any(local.startswith(f"{p.local_label}.") for p in stack.projects)


_CUDA = ("cuda-python", "cuda-bindings")


def _needs(requirements: list[Requirement], version: Version) -> tuple[str, str]:
    """The torch and CUDA a wheel requires (Requires-Dist less extras; ``cuNNN`` labels)."""
    always = [r for r in requirements if r.marker is None or "extra" not in str(r.marker)]
    torch = [str(r.specifier) or "any" for r in always if canonicalize_name(r.name) == "torch"]
    cuda = [str(r) for r in always if canonicalize_name(r.name) in _CUDA
            or canonicalize_name(r.name).startswith("nvidia-cuda-")]
    cuda += [f"CUDA {p[2:-1]}.{p[-1]}" for p in (version.local or "").split(".")
             if p.startswith("cu") and p[2:].isdigit() and len(p) > 3]
    return (", ".join(torch) or "not required",
            ", ".join(sorted(cuda)) or "not pinned by the wheel")


def read_wheel(path: Path) -> Served:
    name, version, _, tags = parse_wheel_filename(path.name)
    metadata = dist_info(path, "METADATA")
    if metadata is None:
        raise ConfigError("not a readable wheel with one top-level .dist-info/METADATA",
                          where=str(path), fix="rebuild the wheel")
    meta = BytesParser().parsebytes(metadata, headersonly=True)
    requires_python = meta.get("Requires-Python", "")
    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    pythons = ", ".join(sorted({t.interpreter for t in tags}))
    torch, cuda = _needs(requirements, version)
    return Served(path=path, project=canonicalize_name(name), version=version,
                  sha256=sha256_file(path), size=path.stat().st_size, metadata=metadata,
                  requires_python=requires_python, torch=torch, cuda=cuda,
                  python=f"{requires_python or 'any'} ({pythons})")


def _checked(path: Path, sha256: str, stack: Stack) -> Served:
    if not path.is_file():
        raise ConfigError("a wheel its build recorded is missing", where=str(path),
                          fix=f"rebuild the stack: {command('build', '--stack', stack.name)}")
    served = read_wheel(path)
    if served.sha256 != sha256:
        raise ArtifactCheckError(
            f"sha256 {served.sha256[:12]}... differs from its build's record "
            f"({sha256[:12]}...)", where=str(path),
            fix=f"rebuild the stack: {command('build', '--stack', stack.name)}")
    return served


def stack_wheels(ws: Workspace, stack: Stack) -> StackWheels | None:
    folder = ws.stack_wheels(stack.name)
    if not (folder / manifest_file.FILE).is_file():
        return None
    manifest = manifest_file.read(folder)
    plugin = PublishedPlugin.read(folder)
    candidates = [_checked(folder / e.wheel, e.sha256, stack) for e in manifest.wheels]
    if plugin is not None:
        candidates.append(_checked(folder / PLUGIN_DIR / plugin.wheel, plugin.sha256, stack))
    aots = [read_wheel(p) for p in sorted(aot_folder(ws, stack).glob("*.whl"))]
    candidates += aots
    left = {w.filename: (
        f"version {w.version} has no local label of the stack "
        f"({', '.join(sorted({p.local_label for p in stack.projects}))}); not served, pip "
        "gets a public release from the public index") for w in candidates
        if not _ours(stack, w.version)}
    for w in (a for a in aots if a.filename not in left):
        built_for = aot_wheel.read_wheel(w.path).flashinfer
        if built_for.sha256 not in {e.sha256 for e in manifest.wheels}:
            left[w.filename] = (
                f"built for a FlashInfer wheel this build did not publish ({built_for.wheel}, "
                f"sha256 {built_for.sha256[:12]}...); not served: rebuild it with "
                f"`{command('build-aot', '--stack', stack.name)}`")
    served = tuple(w for w in candidates if w.filename not in left)
    left_out = tuple(f"{stack.name}: {name}: {why}" for name, why in left.items())
    aot = next((w for w in aots if w in served), None)
    if not any(w.filename == getattr(plugin, "wheel", None) for w in served):
        plugin = None
    return StackWheels(stack=stack, manifest=manifest, plugin=plugin,
                       served=served, aot=aot, left_out=left_out)


API_VERSION = "1.1"
_HEAD = ('<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
         f'<meta name="pypi:repository-version" content="{API_VERSION}">\n'
         "<title>{title}</title>\n</head>\n<body>\n")
_TAIL = "</body>\n</html>\n"


@dataclass(frozen=True, kw_only=True)
class Index:
    out: Path
    url: str
    stacks: tuple[StackWheels, ...]
    files: int
    notes: tuple[str, ...]


def site_url(url: str | None, out: Path) -> str:
    """Ending in ``/``; default: the folder's own ``file://`` URL (pip reads it too)."""
    if url is None:
        return out.resolve().as_uri() + "/"
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "file") or (parts.scheme != "file"
                                                         and not parts.netloc):
        raise UsageError(f"not a site URL: {url!r}", where="index --url",
                         fix=command("index", "--url", "https://OWNER.github.io/REPO/"))
    return url if url.endswith("/") else url + "/"


def _page(title: str, body: str) -> str:
    return _HEAD.format(title=escape(title)) + body + _TAIL


def _json(data: object) -> str:
    return json.dumps(data, indent=1) + "\n"


def _anchor(w: Served) -> str:
    meta = f"sha256={hashlib.sha256(w.metadata).hexdigest()}"
    python = f' data-requires-python="{escape(w.requires_python)}"' if w.requires_python else ""
    return (f'<a href="../../{file_path(w.filename)}#sha256={w.sha256}"{python} '
            f'data-dist-info-metadata="{meta}" data-core-metadata="{meta}">'
            f"{escape(w.filename)}</a><br>\n")


def _project_pages(project: str, wheels: list[Served]) -> dict[str, str]:
    html = _page(f"Links for {project}", f"<h1>Links for {escape(project)}</h1>\n"
                 + "".join(_anchor(w) for w in wheels))
    files = [{"filename": w.filename, "url": f"../../{file_path(w.filename)}",
              "hashes": {"sha256": w.sha256}, "requires-python": w.requires_python or None,
              "core-metadata": {"sha256": hashlib.sha256(w.metadata).hexdigest()}, "size": w.size}
             for w in wheels]
    versions = sorted({w.version for w in wheels})
    data = {"meta": {"api-version": API_VERSION}, "name": project,
            "versions": [str(v) for v in versions], "files": files}
    return {f"simple/{project}/index.html": html, f"simple/{project}/index.json": _json(data)}


def _root_pages(projects: Iterable[str]) -> dict[str, str]:
    names = sorted(projects)
    html = _page("Simple index", "".join(f'<a href="{n}/">{escape(n)}</a><br>\n'
                                          for n in names))
    data = {"meta": {"api-version": API_VERSION}, "projects": [{"name": n} for n in names]}
    return {"simple/index.html": html, "simple/index.json": _json(data)}


def _table(head: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    def row(cells: tuple[str, ...], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>\n"
    return "<table>\n" + row(head, "th") + "".join(row(r, "td") for r in rows) + "</table>\n"


def stack_routes(url: str, s: StackWheels) -> list[Route]:
    aot = f"{s.aot.project}=={s.aot.version}" if s.aot else None
    return index_routes(url, s.manifest.wheels, plugin=s.plugin, aot=aot)


def _stack_section(url: str, s: StackWheels) -> str:
    default = " (default)" if s.stack.default else ""
    routes = _table(("route", "command"), ((escape(r.name), f"<code>{escape(r.line)}</code>")
                                          for r in stack_routes(url, s)))
    wheels = _table(("wheel", "Python", "torch", "CUDA"), (
        (escape(w.filename), escape(w.python), escape(w.torch), escape(w.cuda))
        for w in sorted(s.served, key=lambda w: w.filename)))
    left = "".join(f"<li>{escape(n)}</li>\n" for n in s.left_out)
    return (f'<h2 id="{escape(s.stack.name)}">{escape(s.stack.name)}{default}</h2>\n'
            f"<p>{escape(s.stack.description)}</p>\n{routes}{wheels}"
            + (f"<p>Not served here:</p>\n<ul>\n{left}</ul>\n" if left else ""))


def _landing(url: str, stacks: tuple[StackWheels, ...]) -> str:
    intro = (
        "<h1>sm120fork: SGLang + FlashInfer for SM120/SM121</h1>\n"
        f"<p>A package index of our builds only: <code>{escape(url)}simple/</code>. "
        "Each line below installs one route of one stack and pins every version exactly; "
        "our versions carry a local label (<code>+sm120.1</code>), which pip ranks above "
        "the public release of the same version. The plugin route names the plugin "
        "wheel itself, so that SGLang comes stock from the public index.</p>\n")
    return _page("sm120fork package index", intro + "".join(_stack_section(url, s)
                                                            for s in stacks))


def _files(stacks: tuple[StackWheels, ...]) -> dict[str, Served]:
    files: dict[str, Served] = {}
    for s in stacks:
        for w in s.served:
            seen = files.setdefault(w.filename, w)
            if seen.sha256 != w.sha256:
                raise ConfigError(f"two different wheels named {w.filename}",
                                  where=f"{seen.path} and {w.path}",
                                  fix="rebuild one of the stacks: "
                                      + command("build", "--all-stacks"))
    return dict(sorted(files.items()))


def write_index(ws: Workspace, *, url: str | None = None, out: Path | None = None) -> Index:
    """Staged, then swapped in whole; refused when no stack has been built."""
    out = out or ws.wheels_dir / "index"
    url = site_url(url, out)
    found = {name: stack_wheels(ws, stack) for name, stack in sorted(ws.stacks().items())}
    stacks = tuple(s for s in found.values() if s is not None)
    if not any(s.served for s in stacks):
        raise ConfigError("no built wheels of ours to serve", where=str(ws.wheels_dir),
                          fix=command("build", "--all-stacks"))
    files = _files(stacks)
    by_project: dict[str, list[Served]] = {}
    for w in files.values():
        by_project.setdefault(w.project, []).append(w)
    texts = {"index.html": _landing(url, stacks), **_root_pages(by_project)}
    for project, wheels in by_project.items():
        texts.update(_project_pages(project, wheels))
    with staged_dir(out) as staged:
        for name, text in texts.items():
            _write(staged / name, text.encode())
        for name, w in files.items():
            _write(staged / "files" / f"{name}.metadata", w.metadata)  # makes the folder
            atomic_copy(w.path, staged / "files" / name)
    notes = [f"{name}: not built; not in the index" for name, s in found.items() if s is None]
    notes += [n for s in stacks for n in s.left_out]
    return Index(out=out, url=url, stacks=stacks, files=len(files), notes=tuple(notes))


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o644)
