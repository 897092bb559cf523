"""One self-contained folder that runs the GPU harnesses on a box with no network: the
stack's and upstream's wheels, what the harnesses import (resolved and downloaded by pip),
``kit.json``, ``boot.py`` and ``run``.  torch, and what only torch needs, stays behind: the
box's own is built for its driver.

With ``--part-size``, for transfer paths that take so many bytes, the kit is written in
sibling folders ``DIR.1`` ... ``DIR.N``: whole files where they fit (first fit, largest
first), a larger file cut into pieces.  Each part carries ``run``, ``boot.py`` and a
``kit.json`` listing every piece's part, path and sha256, so any part joins them
(:func:`boot.join`)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name

from sm120fork import __version__
from sm120fork.errors import ConfigError
from sm120fork.gpu.core.records import TESTED_FILE
from sm120fork.gpu.core.stack_wheels import installable, plugin_wheel, upstream_wheel
from sm120fork.gpu.core.variants import copy_modules
from sm120fork.kit import boot
from sm120fork.manifest import Manifest
from sm120fork.package.wheel import wheel_requirements
from sm120fork.resolved import UPSTREAM_TESTS, ResolvedStack
from sm120fork.util import proc, typed
from sm120fork.util.files import replace_dir, scratch_prefix, sha256_file, staged_dir
from sm120fork.util.hint import command
from sm120fork.workspace import Workspace

log = logging.getLogger("sm120fork")

MIB = 1024 * 1024

#: What FlashInfer declares that the comm path never imports (large downloads).
FLASHINFER_UNUSED = ("nvidia-cutlass-dsl", "nvidia-cudnn-frontend")
#: What SGLang's layer modules import (the sglang-probe dependency group), and what SGLang
#: 0.5.23 imports besides, found by running the layer harness on a CPU with only the kit.
SGLANG_LAYER_IMPORTS = (
    "transformers", "openai", "numpy", "tqdm", "pybase64", "requests", "ipython", "pydantic",
    "aiohttp", "safetensors", "orjson", "packaging", "pillow", "starlette",
    "partial-json-parser", "huggingface-hub", "pyzmq", "dill", "sentencepiece",
    "compressed-tensors", "gguf", "msgspec", "uvicorn", "fastapi",
)
#: What nox's GPU sessions need on the box to install the checkout offline.
NOX_TOOLS = ("nox", "setuptools>=69")
#: Left out by default: the box's torch, and (by the graph) what only torch needs.
BOX_TORCH = ("torch",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """The box's interpreter and platform, as pip's --python-version/--platform take them."""

    python: str
    platforms: tuple[str, ...]

    @property
    def pip_options(self) -> list[str]:
        nodot = self.python.replace(".", "")
        return ["--only-binary=:all:", "--python-version", self.python, "--implementation",
                "cp", "--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none",
                *(x for p in self.platforms for x in ("--platform", p))]

    def tags(self) -> set[Tag]:
        version = tuple(int(x) for x in self.python.split("."))
        return (set(cpython_tags(version, platforms=self.platforms))
                | set(compatible_tags(version, platforms=[*self.platforms, "any"])))

    def environment(self) -> dict[str, str]:
        return {"python_version": self.python, "python_full_version": f"{self.python}.0",
                "sys_platform": "linux", "platform_system": "Linux",
                "platform_machine": "x86_64", "os_name": "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def manylinux(arch: str = "x86_64", newest: int = 39) -> tuple[str, ...]:
    """Every manylinux tag of ``arch`` up to glibc 2.``newest`` (pip matches tags exactly)."""
    return (*(f"manylinux_2_{n}_{arch}" for n in range(newest, 16, -1)),
            f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class KitOptions:
    python: str
    out: Path
    harnesses: tuple[str, ...] = boot.DEFAULT_HARNESSES
    platforms: tuple[str, ...] = manylinux()
    box_has: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    max_size: int | None = None
    part_size: int | None = None
    prebuilt: Path | None = None
    nox: bool = True
    #: The stack's upstream PRs' GPU tests (upstream.groups.write_gpu_tests).
    upstream_tests: Path | None = None

    @property
    def target(self) -> Target:
        return Target(python=self.python, platforms=self.platforms)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kit:
    path: Path
    files: dict[str, int]  # path inside the kit -> bytes
    parts: tuple[tuple[Path, int], ...] = ()  # with --part-size: (folder, bytes) of each

    @property
    def size(self) -> int:
        return sum(self.files.values())


def _parse_box_has(entries: Iterable[str]) -> dict[str, str | None]:
    """``name==version`` or bare names (from a file, or the option) -> {name: version}."""
    found: dict[str, str | None] = {}
    for entry in entries:
        looks_like_file = "," not in entry and ("/" in entry or entry.endswith(".txt"))
        if looks_like_file and not Path(entry).is_file():
            raise ConfigError("no such file", where=f"--box-has {entry}",
                              fix="python3 -m pip list --format=freeze > box.txt on the box")
        lines = (Path(entry).read_text(encoding="utf-8").splitlines() if looks_like_file
                 else entry.split(","))
        for raw in lines:
            line = raw.split("#")[0].strip()
            if not line or line.startswith("-"):
                continue
            name, _, version = line.partition("==")
            found[canonicalize_name(name.split(" @ ")[0].strip())] = version.strip() or None
    return found


def _marker_holds(marker: Marker | None, env: dict[str, str], extras: Iterable[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**env, "extra": e}) for e in ("", *extras))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Metadata:
    name: str = ""
    version: str = ""
    requires_dist: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resolved:
    """An ``install`` item of pip's installation report."""

    metadata: Metadata
    requested_extras: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Report:
    install: tuple[Resolved, ...]


def resolution(data: object, where: str) -> dict[str, Resolved]:
    """pip's installation report ``data`` as {canonical name: what it installs}."""
    fix = "pip >= 23 writes it (python -m pip install -U pip)"
    try:
        report = typed.read(_Report, data, where, strict=False)
    except typed.MalformedError as exc:
        raise ConfigError(f"not a pip installation report: {exc.what}", where=exc.where,
                          fix=fix) from None
    for i, item in enumerate(report.install):
        if not item.metadata.name or not item.metadata.version:
            raise ConfigError("not a pip installation report: has no name and version",
                              where=f"{where}: install[{i}].metadata", fix=fix)
    return {canonicalize_name(item.metadata.name): item for item in report.install}


def needed(items: Mapping[str, Resolved], roots: Sequence[Requirement], target: Target,
           provided: dict[str, str | None]) -> list[tuple[str, str]]:
    """(name, version) of what ``items`` installs that the box lacks: reached from
    ``roots`` without passing through what the box ``provided``."""
    env = target.environment()

    def gone(name: str) -> bool:
        if name not in provided:
            return False
        version = provided[name]
        return version is None or items[name].metadata.version == version

    seen: set[str] = set()
    todo = [canonicalize_name(r.name) for r in roots if _marker_holds(r.marker, env, ())]
    while todo:
        name = todo.pop()
        if name in seen or name not in items or gone(name):
            continue
        seen.add(name)
        item = items[name]
        for text in item.metadata.requires_dist:
            req = Requirement(text)
            if _marker_holds(req.marker, env, item.requested_extras):
                todo.append(canonicalize_name(req.name))
    return sorted((name, items[name].metadata.version) for name in seen)


def _pip(*args: str | Path) -> None:
    proc.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *map(str, args)])


def resolve(roots: Sequence[Requirement], target: Target, scratch: Path
            ) -> dict[str, Resolved]:
    """pip's own resolution of ``roots`` for the target (metadata only, nothing installed)."""
    report = scratch / "resolution.json"
    _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", report,
         *target.pip_options, *map(str, roots))
    return resolution(typed.json_file(report), str(report))


def download(pins: Sequence[tuple[str, str]], target: Target, dest: Path) -> None:
    if pins:
        _pip("download", "--no-deps", "--quiet", "--dest", dest, *target.pip_options,
             *(f"{n}=={v}" for n, v in pins))


def stack_wheels(folder: Path, manifest: Manifest, target: Target,
                 harnesses: Sequence[str]) -> dict[str, Path]:
    """{project: wheel} of the stack's build that install on the target."""
    chosen = {p: folder / w.wheel for p, w in installable(manifest, target.tags()).items()}
    for wheel in chosen.values():
        if not wheel.is_file():
            raise ConfigError(f"{wheel.name} is listed in the manifest but missing",
                              where=str(folder), fix=command("build", "--stack", manifest.stack))
    if "flashinfer" not in chosen:
        raise ConfigError(f"the build has no FlashInfer wheel for Python {target.python} "
                          "on the target platform", where=str(folder / "manifest.json"))
    if "sglang_layer" in harnesses and "sglang" not in chosen:
        raise ConfigError(f"stack {manifest.stack} has no SGLang wheel for Python "
                          f"{target.python} (sglang_layer needs one)", where=str(folder),
                          fix=command("build", "--stack", manifest.stack))
    return chosen


def _toolkit_wheel(root: Path, dest: Path) -> Path:
    """The toolkit's wheel, of the checkout, else of the source tree this code runs from."""
    source = next((c for c in (root, Path(__file__).resolve().parents[3])
                   if (c / "pyproject.toml").is_file()
                   and (c / "src" / "sm120fork" / "__init__.py").is_file()), None)
    if source is None:
        raise ConfigError("no toolkit source tree (pyproject.toml, src/sm120fork/)",
                          where=str(root), fix="run it in a checkout of the toolkit")
    _pip("wheel", "--no-deps", "--quiet", "--wheel-dir", dest, source)
    found = sorted(dest.glob("sm120fork-*.whl"))
    if len(found) != 1:
        raise ConfigError(f"expected one sm120fork wheel, got {[w.name for w in found]}",
                          where=str(dest))
    return found[0]


def _roots(harness: str, wheels: dict[str, Path], toolkit: Path | None) -> list[Requirement]:
    """What ``harness`` imports beyond the standard library and torch (and the
    ``toolkit`` wheel's requirements)."""
    roots = ([r for r in wheel_requirements(toolkit) if r.marker is None]
             if toolkit is not None else [])
    fi = [r for r in wheel_requirements(wheels["flashinfer"])
          if canonicalize_name(r.name) not in FLASHINFER_UNUSED and r.marker is None]
    if harness in ("gpu_test", "bench", "tune") or (harness == "doctor"
                                                     and "sglang" not in wheels):
        return roots + fi  # tune: the doctor's facts, then the bench
    if harness == "upstream_tests":
        return [*roots, *fi, Requirement("pytest")]
    # sglang_layer, and the doctor of a stack with SGLang: its --tp decisions import SGLang
    # (its start-up code, plugins loaded), which needs SGLang's own imports
    sglang = {canonicalize_name(r.name): r for r in wheel_requirements(wheels["sglang"])
              if r.marker is None}
    layer = [sglang.get(canonicalize_name(n), Requirement(n)) for n in SGLANG_LAYER_IMPORTS]
    return roots + fi + layer


def harness_requirements(harness: str, wheels: dict[str, Path]) -> list[Requirement]:
    """What ``harness`` needs of the stack's wheels' requirements, less torch: ``nox -s
    gpu_test`` installs them beside the toolkit (the variants' FlashInfer has no deps)."""
    toolkit_free = {canonicalize_name(n) for n in BOX_TORCH}
    return [r for r in _roots(harness, wheels, None)
            if canonicalize_name(r.name) not in toolkit_free]


def stack_requirements(stack: ResolvedStack, harness: str) -> list[str]:
    """``harness_requirements`` of a built stack, for this Python."""
    here = Target(python=f"{sys.version_info[0]}.{sys.version_info[1]}",
                  platforms=manylinux(platform.machine() or "x86_64"))
    wheels = stack_wheels(stack.folder, stack.build(), here, (harness,))
    return [str(r) for r in harness_requirements(harness, wheels)]


def stock_sglang(ws: Workspace, manifest: Manifest, patched: Path) -> Path:
    """The upstream wheel the build patched into ``patched``, from the build's cache."""
    entry = next((w for w in manifest.wheels if w.wheel == patched.name), None)
    source = entry.source if entry is not None else None
    stack = manifest.stack
    if source is None or source.kind != "wheel" or not source.filename:
        raise ConfigError(f"the build of {patched.name} names no upstream wheel",
                          where="manifest.json", fix=command("build", "--stack", stack))
    wheel = ws.wheel_cache / source.filename
    if not wheel.is_file() or sha256_file(wheel) != source.digest:
        raise ConfigError(f"stock {source.filename} (the plugin route's SGLang) is "
                          f"{'not the one the build used' if wheel.is_file() else 'missing'}",
                          where=str(ws.wheel_cache), fix=command("build", "--stack", stack))
    return wheel


def _check_size(files: dict[str, int], limit: int | None) -> None:
    total = sum(files.values())
    if limit is None or total <= limit:
        return
    big = sorted(files.items(), key=lambda kv: -kv[1])[:6]
    raise ConfigError(
        f"the kit would be {total / MIB:.1f} MiB, over --max-size {limit / MIB:.0f} MiB; "
        "the biggest: " + ", ".join(f"{n} {s / MIB:.1f} MiB" for n, s in big),
        fix="carry fewer harnesses (--harness gpu_test), leave out what the box has "
            "(--box-has FILE from `python3 -m pip list --format=freeze` there), "
            "or raise --max-size")


RUN_SCRIPT = """#!/bin/sh
# The offline GPU kit of {stack} for Python {python}: sh run VERB [ARGS...]
#   VERB: """ + " | ".join(boot.VERBS) + """; ARGS: the harness's own (--help).
# Needs only this folder, the box's GPUs and its Python with torch ($PYTHON, or python3).
exec "${{PYTHON:-python3}}" "$(dirname "$0")/boot.py" "$@"
"""


def _inputs(opts: KitOptions, stack: ResolvedStack
            ) -> tuple[dict[str, Path], dict[str, Path], boot.KitJson]:
    """The stack's wheels {project: wheel}, what the kit carries of the build and upstream
    {path in the kit: file or folder}, and the kit.json keys that name them."""
    manifest = stack.build()
    wheels = stack_wheels(stack.folder, manifest, opts.target, opts.harnesses)
    files = {f"stack/{w.name}": w for w in wheels.values()}
    files["stack/manifest.json"] = stack.manifest_path
    keys = boot.KitJson(patched={p: f"stack/{w.name}" for p, w in wheels.items()},
                        upstream={}, plugin_route={})
    fi_entry = manifest.first("flashinfer")  # there: stack_wheels refused a build without
    if fi_entry is not None and not fi_entry.used_as_published:
        upstream = upstream_wheel(stack)
        keys["upstream"]["flashinfer"] = f"upstream/{upstream.name}"
        files[f"upstream/{upstream.name}"] = upstream
    plugin = plugin_wheel(stack.folder) if "sglang_layer" in opts.harnesses else None
    if plugin is not None:
        stock = stock_sglang(stack.ws, manifest, wheels["sglang"])
        route = {"plugin": f"stack/plugin/{plugin.name}", "sglang": f"upstream/{stock.name}"}
        keys["plugin_route"] = route
        keys["upstream"]["sglang"] = route["sglang"]
        files |= {"stack/plugin": plugin.parent, route["sglang"]: stock}
    return wheels, files, keys


def _carry_requirements(opts: KitOptions, stack: ResolvedStack, wheels: dict[str, Path],
                        provided: dict[str, str | None], new: Path, scratch: Path
                        ) -> dict[str, list[str]]:
    """Download what the harnesses import that the box may lack; each harness's
    requirements as its entry installs them."""
    target = opts.target
    toolkit = _toolkit_wheel(stack.ws.root, new / "wheels")
    requirements: dict[str, list[str]] = {}
    all_roots: list[Requirement] = [Requirement(n) for n in opts.include]
    for harness in opts.harnesses:
        roots = _roots(harness, wheels, toolkit)
        all_roots += roots
        requirements[harness] = ["sm120fork", *sorted({str(r) for r in roots}
                                                      - {"sm120fork"})]
    if opts.nox:
        all_roots += [Requirement(n) for n in NOX_TOOLS]
    # torch's metadata names GBs of CUDA libraries: what the box provides is not resolved.
    all_roots = [r for r in all_roots if canonicalize_name(r.name) not in provided
                 or provided[canonicalize_name(r.name)] is not None]
    log.info("resolving what the harnesses import, for Python %s (pip)", opts.python)
    pins = needed(resolve(all_roots, target, scratch), all_roots, target, provided)
    log.info("downloading %d wheels the box may lack", len(pins))
    download(pins, target, new / "wheels")
    # What the box provides is not installed by the entry: the box's wins.
    kept = {n for n, _ in pins}
    return {harness: [r for r in reqs if r == "sm120fork"
                      or canonicalize_name(Requirement(r).name) in kept]
            for harness, reqs in requirements.items()}


def make(opts: KitOptions, stack: ResolvedStack) -> Kit:
    """Write the kit for ``stack`` at ``opts.out`` (replaced as a whole)."""
    if not re.fullmatch(r"3\.\d+", opts.python):
        raise ConfigError(f"bad Python version {opts.python!r}", where="--python",
                          fix="e.g. --python 3.12")
    wheels, carried, keys = _inputs(opts, stack)
    # The box's torch, whatever version --box-has names (torch==2.11.0+cu130 is no index's),
    # stays behind; --include forces a name back in.
    provided = _parse_box_has(opts.box_has) | {canonicalize_name(n): None for n in BOX_TORCH}
    for name in opts.include:
        provided.pop(canonicalize_name(name), None)
    dest = opts.out.absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    parts: list[tuple[Path, int]] = []
    with (tempfile.TemporaryDirectory(prefix=scratch_prefix(dest.name), dir=dest.parent,
                                      ignore_cleanup_errors=True) as tmp,
          staged_dir(dest, label="kit") if opts.part_size is None  # else cut into parts
          else contextlib.nullcontext(Path(tmp) / "kit") as new):
        for sub in ("stack", "upstream", "wheels"):
            (new / sub).mkdir(parents=True)
        for name, source in carried.items():
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, new / name)
        (new / "stack" / TESTED_FILE).write_text(
            json.dumps(typed.dump(stack.tested()), indent=1, sort_keys=True) + "\n",
            encoding="utf-8")
        requirements = _carry_requirements(opts, stack, wheels, provided, new, Path(tmp))
        prebuilt = {}
        if opts.prebuilt is not None:
            prebuilt = _copy_prebuilt(opts.prebuilt, new / "prebuilt")
        if opts.upstream_tests is not None:
            shutil.copytree(opts.upstream_tests, new / UPSTREAM_TESTS)
        shutil.copy2(Path(boot.__file__), new / "boot.py")
        data = {
            "format": boot.KIT_FORMAT, "stack": stack.name, "python": opts.python,
            "platforms": list(opts.platforms), "toolkit": __version__, **keys,
            "prebuilt": prebuilt,
            # the layer harness reads it from forks/ otherwise
            "sglang_layout": next((p.layout for p in stack.stack.projects
                                   if p.normalized_name == "sglang"), ""),
            "requirements": requirements,
            "upstream_tests": UPSTREAM_TESTS if opts.upstream_tests is not None else None,
            "left_out": sorted(set(provided)),
            "wheels": [{"file": name, "sha256": sha256_file(new / name), "size": size}
                       for name, size in files_of(new).items() if name.endswith(".whl")],
        }
        (new / boot.KIT_FILE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n",
                                         encoding="utf-8")
        run = new / "run"
        run.write_text(RUN_SCRIPT.format(stack=stack.name, python=opts.python),
                       encoding="utf-8")
        run.chmod(0o755)
        files = files_of(new)
        _check_size(files, opts.max_size)
        if opts.part_size is not None:
            log.info("cutting the kit into parts of at most %.1f MiB", opts.part_size / MIB)
            parts = [(opts.out.parent / folder.name, size)  # named as the user named --out
                     for folder, size in write_parts(new, dest, opts.part_size)]
    return Kit(path=opts.out, files=files, parts=tuple(parts))


def _copy_prebuilt(source: Path, dest: Path) -> dict[str, str]:
    found = {v.name: f"prebuilt/{v.name}" for v in sorted(source.glob("*/"))
             if copy_modules(v, dest / v.name)}
    if not found:
        raise ConfigError("holds no <variant>/<module>/<module>.so", where=str(source),
                          fix="e.g. patched/trtllm_comm/trtllm_comm.so, compiled with "
                              "sm120fork.aot.compile for the box's GPU")
    return found


def parse_size(text: str, option: str = "--max-size") -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if not m:
        raise ConfigError(f"bad size {text!r}", where=option, fix="e.g. 64MiB")
    scale = {"": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


OWN_FILES = ("run", "boot.py")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Piece:
    file: str  # path inside the kit
    offset: int
    size: int
    index: int  # 1-based
    count: int

    @property
    def path(self) -> str:
        suffix = "" if self.count == 1 else f".piece-{self.index}-of-{self.count}"
        return f"data/{self.file}{suffix}"


def files_of(folder: Path) -> dict[str, int]:
    """{path inside ``folder``: bytes} of its files."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in sorted(folder.rglob("*")) if p.is_file()}


def layout(files: dict[str, int], budget: int) -> list[list[Piece]]:
    """The kit's files (path -> bytes) in parts of at most ``budget`` bytes (ties by name:
    the same kit gives the same parts)."""
    pieces: list[Piece] = []
    for name, size in files.items():
        count = max(1, -(-size // budget))
        pieces += [Piece(file=name, offset=i * budget, size=min(budget, size - i * budget),
                         index=i + 1, count=count) for i in range(count)]
    bins: list[list[Piece]] = []
    for piece in sorted(pieces, key=lambda p: (-p.size, p.file, p.index)):
        fit = next((b for b in bins if sum(p.size for p in b) + piece.size <= budget), None)
        if fit is None:
            bins.append([piece])
        else:
            fit.append(piece)
    return bins


def _index(kit: Path, bins: list[list[Piece]], shas: dict[tuple[str, int], str],
           part: int) -> boot.PartsIndex:
    where = {(p.file, p.index): n for n, pieces in enumerate(bins, 1) for p in pieces}
    files = []
    for name in sorted({p.file for pieces in bins for p in pieces}):
        pieces = sorted((p for b in bins for p in b if p.file == name), key=lambda p: p.index)
        files.append(boot.PartFile(
            file=name, size=sum(p.size for p in pieces), sha256=shas[(name, 0)],
            pieces=tuple(boot.PartPiece(part=where[(name, p.index)], path=p.path,
                                        size=p.size, sha256=shas.get((name, p.index), ""))
                         for p in pieces),
            executable=os.access(kit / name, os.X_OK)))
    listed = json.dumps([dataclasses.asdict(f) for f in files], sort_keys=True)
    kit_id = hashlib.sha256(listed.encode()).hexdigest()
    return boot.PartsIndex(kit_id=kit_id, part=part, parts=len(bins), files=tuple(files))


def plan(kit: Path, part_size: int) -> list[list[Piece]]:
    """The parts of ``kit``, leaving room in each for ``run``, ``boot.py`` and
    ``kit.json``."""
    files = files_of(kit)
    own = sum((kit / name).stat().st_size for name in OWN_FILES)
    overhead = own + 4096
    while True:
        budget = part_size - overhead
        if budget < 1024:
            raise ConfigError(
                f"a part of {part_size} bytes leaves no room for the kit's files (each part "
                f"carries its own run, boot.py and kit.json, {overhead} bytes)",
                where="--part-size", fix="e.g. --part-size 60MiB")
        bins = layout(files, budget)
        # The index's own size, with every sha256 as long as it will be.
        fake = {(p.file, i): "0" * 64 for b in bins for p in b for i in (0, p.index)}
        needed = own + len(_index(kit, bins, fake, len(bins)).dumps().encode())
        if needed <= overhead:
            return bins
        overhead = needed + 1024


def write_parts(kit: Path, out: Path, part_size: int) -> list[tuple[Path, int]]:
    """``kit`` as ``out.1`` ... ``out.N`` (each replaced as a whole, stale higher parts
    removed): (part folder, bytes) of each."""
    bins = plan(kit, part_size)
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(out.name + "-parts"),
                                    dir=out.parent))
    try:
        shas: dict[tuple[str, int], str] = {}
        for n, pieces in enumerate(bins, 1):
            for p in pieces:  # a piece is at most a part's size: read whole
                with (kit / p.file).open("rb") as f:
                    f.seek(p.offset)
                    data = f.read(p.size)
                (scratch / str(n) / p.path).parent.mkdir(parents=True, exist_ok=True)
                (scratch / str(n) / p.path).write_bytes(data)
                shas[(p.file, p.index)] = hashlib.sha256(data).hexdigest()
                if p.index == 1:  # the whole file's: its one piece's, else hashed again
                    shas[(p.file, 0)] = shas[(p.file, 1)] if p.count == 1 else sha256_file(
                        kit / p.file)
        final = []
        for n in range(1, len(bins) + 1):
            folder = scratch / str(n)
            for name in OWN_FILES:
                shutil.copy2(kit / name, folder / name)
            index = _index(kit, bins, shas, n).dumps()
            (folder / boot.KIT_FILE).write_text(index, encoding="utf-8")
            final.append((out.parent / f"{out.name}.{n}", sum(files_of(folder).values())))
        for n, (dest, _) in enumerate(final, 1):
            replace_dir(scratch / str(n), dest)
        for n in itertools.count(len(bins) + 1):  # the higher parts of an older kit
            stale = out.parent / f"{out.name}.{n}"
            try:
                boot.read_parts(stale)
            except boot.KitError:
                break
            shutil.rmtree(stale)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final

