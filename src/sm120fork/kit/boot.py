"""The offline kit's entry on the GPU box (``sh DIR/run VERB [ARGS]``): joins a kit in
parts, installs VERB's wheels into a private venv that also sees the box's torch, runs the
harness.  Standard library only: the toolkit is not installed yet when it starts."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import typing
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict, TypeVar

_T = TypeVar("_T")

KIT_FILE = "kit.json"
KIT_FORMAT = "sm120fork-kit/1"
PARTS_FORMAT = "sm120fork-kit-parts/1"
#: In a joined kit: the parts' id it was joined from (a second run joins nothing).
JOINED_FILE = ".joined-from"
PTH_NAME = "sm120fork-host-site.pth"
#: ``sh DIR/run sglang_layer --plugin-route``: stock SGLang of the pin + the plugin.
PLUGIN_ROUTE = "--plugin-route"
#: What each verb runs (after ``python -m``).
HARNESSES = {"gpu_test": ("sm120fork.gpu", "test"), "bench": ("sm120fork.gpu", "bench"),
             "sglang_layer": ("sm120fork.gpu", "sglang-layer"), "doctor": ("sm120fork.doctor",),
             "upstream_tests": ("sm120fork.gpu", "upstream-tests"), "tune": ("sm120fork", "tune")}
VERBS = tuple(HARNESSES)
#: What a kit carries unless ``gpu-kit --harness`` names others.
DEFAULT_HARNESSES = ("gpu_test", "bench", "doctor")
#: Exit codes as the toolkit's errors have them (errors.py): ConfigError, UsageError.
EXIT_CONFIG = 2
EXIT_USAGE = 16


class KitError(Exception):
    def __init__(self, text: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(text)
        self.code = code


def see_host(host: str, purelib: str | None = None) -> Path:
    """Make the running venv see ``host``'s packages after its own (a ``.pth`` file that
    adds the folders ``host`` imports installed packages from, with ``site.addsitedir``)."""
    code = ("import json, site, sys; d = site.getsitepackages() if hasattr(site, "
            "'getsitepackages') else []; u = site.getusersitepackages(); "
            "print(json.dumps([p for p in sys.path if p and (p in d or p == u)]))")
    done = subprocess.run([host, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KitError(f"{host} does not run: {done.stderr.strip()[-300:]}")
    target = Path(purelib or sysconfig.get_paths()["purelib"])
    own = {os.path.realpath(target)}
    dirs = [d for d in json.loads(done.stdout)
            if Path(d).is_dir() and os.path.realpath(d) not in own]
    pth = target / PTH_NAME
    pth.write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dirs),
                   encoding="utf-8")
    return pth


class KitWheel(TypedDict):
    file: str
    sha256: str
    size: int


class KitJson(TypedDict, total=False):
    """``kit.json``: paths are relative to the kit."""

    format: str
    stack: str
    python: str
    platforms: list[str]
    toolkit: str
    #: {project: wheel} of the stack's build, and of upstream's (the A/B's baseline)
    patched: dict[str, str]
    upstream: dict[str, str]
    #: ``plugin`` and stock ``sglang`` wheels of the plugin route
    plugin_route: dict[str, str]
    prebuilt: dict[str, str]
    sglang_layout: str
    requirements: dict[str, list[str]]
    upstream_tests: str | None
    left_out: list[str]
    wheels: list[KitWheel]


def _read(path: Path, *formats: str) -> Any:
    """The object in ``path``, of one of ``formats`` (the first is the one expected)."""
    what = "a kit part" if formats[0] == PARTS_FORMAT else "a kit"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KitError(f"{path}: not {what} ({exc})") from None
    if not isinstance(data, dict) or data.get("format") not in formats:
        raise KitError(f"{path}: not {what} of format {formats[0]}")
    return data


def load(kit: Path) -> KitJson:
    return _read(kit / KIT_FILE, KIT_FORMAT)  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PartPiece:
    part: int
    path: str
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class PartFile:
    file: str
    size: int
    sha256: str
    pieces: tuple[PartPiece, ...]
    executable: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class PartsIndex:
    """The ``kit.json`` of one part (``sm120fork.kit.build`` writes it)."""

    kit_id: str
    part: int
    parts: int
    files: tuple[PartFile, ...]

    def dumps(self) -> str:
        data = {"format": PARTS_FORMAT, **dataclasses.asdict(self)}
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


_KINDS = {str: "a string", int: "a number", bool: "a boolean"}


def _typed(cls: type[_T], data: object, where: Path) -> _T:
    """``data`` as a ``cls``: a dataclass of str, int, bool and tuples of such dataclasses."""
    if not isinstance(data, dict):
        raise KitError(f"{where}: not a kit part ({cls.__name__} is not an object)")
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _field(hints[f.name], f.name, data.get(f.name, f.default), where)
                  for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def _field(hint: Any, name: str, value: object, where: Path) -> object:
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list):
            raise KitError(f"{where}: not a kit part ({name} is not a list)")
        return tuple(_typed(typing.get_args(hint)[0], v, where) for v in value)
    if not isinstance(value, hint) or isinstance(value, bool) is not (hint is bool):
        raise KitError(f"{where}: not a kit part ({name} is not {_KINDS[hint]})")
    return value


def read_parts(part: Path) -> PartsIndex:
    return _typed(PartsIndex, _read(part / KIT_FILE, PARTS_FORMAT), part / KIT_FILE)


def check_parts(index: PartsIndex, parts: Sequence[Path]) -> None:
    """Every part is there, of this kit, and every piece has its size (no hashing)."""
    missing = [p for p in parts if not (p / KIT_FILE).is_file()]
    if missing:
        raise KitError(
            f"part{'s' if len(missing) > 1 else ''} "
            f"{', '.join(p.name for p in missing)} of {len(parts)} "
            f"{'are' if len(missing) > 1 else 'is'} missing: copy "
            f"{'them' if len(missing) > 1 else 'it'} beside {parts[0].parent}/"
            f"{next(p for p in parts if p not in missing).name}")
    for p in parts:
        if _read(p / KIT_FILE, PARTS_FORMAT).get("kit_id") != index.kit_id:
            raise KitError(f"part {p.name} is from another kit (or another build of it): "
                           "copy the parts of one build side by side")
    damaged = []
    for entry in index.files:
        for piece in entry.pieces:
            path = parts[piece.part - 1] / piece.path
            if not path.is_file() or path.stat().st_size != piece.size:
                damaged.append(f"{parts[piece.part - 1].name} ({entry.file}: "
                               f"{'missing' if not path.is_file() else 'wrong size'})")
    if damaged:
        raise KitError(f"damaged part{'s' if len(damaged) > 1 else ''}: {'; '.join(damaged)}: "
                       "copy those parts again")


def join(part: Path, index: PartsIndex) -> Path:
    """The kit ``part`` belongs to, joined beside the parts once: staged, renamed into
    place only when every sha256 holds."""
    suffix = f".{index.part}"
    if not part.name.endswith(suffix) or part.name == suffix:
        raise KitError(f"{part} is part {index.part} of a kit and must keep its name "
                       f"<kit>{suffix}, beside the other parts")
    joined = part.parent / part.name[: -len(suffix)]
    parts = [joined.with_name(f"{joined.name}.{i}") for i in range(1, index.parts + 1)]
    marker = joined / JOINED_FILE
    if marker.is_file() and marker.read_text(encoding="utf-8").strip() == index.kit_id:
        return joined
    if joined.exists() and not (joined / KIT_FILE).is_file():
        raise KitError(f"{joined} is there and is no kit: move it away, then run again")
    check_parts(index, parts)
    for stale in joined.parent.glob(f".{joined.name}.joining-*"):  # of a join killed midway
        try:
            os.kill(int(stale.name.rsplit("-", 1)[-1]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(stale, ignore_errors=True)
        except PermissionError:  # another user's join, still running
            pass
    print(f"joining {len(parts)} parts into {joined}", file=sys.stderr, flush=True)
    staging = joined.parent / f".{joined.name}.joining-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        damaged = []
        for entry in index.files:
            dest = staging / entry.file
            dest.parent.mkdir(parents=True, exist_ok=True)
            whole = hashlib.sha256()
            with dest.open("wb") as out:
                for piece in entry.pieces:  # at most a part's size: read whole
                    data = (parts[piece.part - 1] / piece.path).read_bytes()
                    whole.update(data)
                    out.write(data)
                    if hashlib.sha256(data).hexdigest() != piece.sha256:
                        damaged.append(f"{parts[piece.part - 1].name} ({entry.file})")
            if entry.executable:
                dest.chmod(0o755)
            if whole.hexdigest() != entry.sha256 and not damaged:
                damaged.append(f"{entry.file} (joined)")
        if damaged:
            raise KitError(f"damaged part{'s' if len(damaged) > 1 else ''}, sha256 does not "
                           f"match: {'; '.join(damaged)}: copy those parts again")
        (staging / JOINED_FILE).write_text(index.kit_id + "\n", encoding="utf-8")
        if joined.exists():  # an older kit of that name: its private venv goes with it
            old = joined.parent / f".{joined.name}.old-{os.getpid()}"
            joined.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        staging.rename(joined)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return joined


def _run(cmd: Sequence[str | os.PathLike[str]], **kw: object) -> int:
    print("+ " + shlex.join(os.fspath(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([os.fspath(c) for c in cmd], check=False, **kw).returncode  # type: ignore[call-overload, no-any-return]


def prepare(kit: Path, data: KitJson, verb: str, home: Path,
            plugin_route: bool = False) -> Path:
    """The private venv with VERB's wheels (once per kit and verb); its python.  The
    plugin route's venv also holds the plugin and the stack's FlashInfer."""
    want = data["python"]
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if have != want:
        raise KitError(f"this kit is for Python {want}, this is Python {have} "
                       f"({sys.executable}): run it with PYTHON=python{want} sh "
                       f"{kit}/run ..., or make a kit with --python {have}")
    requirements = data["requirements"]
    if verb not in requirements:
        raise KitError(f"this kit carries no {verb} (it has {', '.join(requirements)}): make "
                       f"it with --harness {verb}", EXIT_USAGE)
    reqs = requirements[verb]
    beside: list[Path] = []
    if plugin_route:
        route = data.get("plugin_route") or {}
        if not route:
            raise KitError(f"this kit carries no plugin route (stack {data.get('stack')}: its "
                           "build has no plugin, or the kit was made without --harness "
                           "sglang_layer)", EXIT_USAGE)
        beside = [kit / route["plugin"], kit / data["patched"]["flashinfer"]]
    digest = hashlib.sha256(json.dumps([data["wheels"], reqs, sys.executable,
                                        [str(b) for b in beside]]).encode()).hexdigest()[:16]
    venv = home / ("venv-plugin-route" if plugin_route else "venv")
    python = venv / "bin" / "python"
    marker = venv / f".installed-{verb}"
    if marker.is_file() and marker.read_text().strip() == digest:
        return python
    if not python.exists() and _run(
            [sys.executable, "-m", "venv", "--without-pip", venv]) != 0:
            raise KitError(f"could not make a virtual environment in {venv}")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    see_host(sys.executable, purelib)
    # The host's pip, seen through the .pth, installs into the venv (no pip of its own).
    pip: list[str | os.PathLike[str]] = [
        python, "-m", "pip", "install", "--no-index", "--find-links", kit / "wheels",
        "--disable-pip-version-check", "--no-warn-script-location", "-q"]
    no_config = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    if _run([*pip, *reqs], env=no_config) != 0:
        cause = (f"{sys.executable} has no torch, which the kit leaves to the box (its CUDA "
                 f"build): run it with the Python that has it, PYTHON=/path/to/python sh "
                 f"{kit}/run {verb} ..." if importlib.util.find_spec("torch") is None else
                 "the box lacks a package the kit does not carry; make the kit again with "
                 "that package's name in --include")
        raise KitError(f"installing the kit's wheels for {verb} failed (see pip's message "
                       f"above): {cause}")
    if beside and _run([*pip, "--no-deps", *beside], env=no_config) != 0:
        raise KitError("installing the plugin and the stack's FlashInfer failed (see pip's "
                       "message above)")
    marker.write_text(digest + "\n")
    return python


def _given(args: Sequence[str], name: str) -> bool:
    return any(arg == name or arg.startswith(name + "=") for arg in args)


def harness_command(kit: Path, data: KitJson, verb: str, args: Sequence[str],
                    home: Path) -> tuple[list[str], dict[str, str]]:
    """The harness's arguments (after ``python -m``) and extra environment for VERB."""
    stack, patched = data["stack"], data["patched"]
    shown = shlex.join(["sh", f"<kit {stack}>/run", verb,
                        *_without(args, ("--out", "--work-dir"))])
    env = {"SM120FORK_COMMAND": shown}
    defaults = {"--out": str(Path("kit-results") / stack / verb),
                "--work-dir": str(home / "work")}
    if verb == "tune":  # tune has no --out; its --reports are for record import
        defaults = {"--work-dir": defaults["--work-dir"], "--reports": "kit-results"}
    if verb == "sglang_layer" and data.get("sglang_layout"):
        defaults["--layout"] = data["sglang_layout"]  # the harness reads forks/ otherwise
    extra = [x for name, value in defaults.items() if not _given(args, name)
             for x in (name, value)]
    if verb == "upstream_tests" and not data.get("upstream_tests"):
        raise KitError("this kit carries no upstream tests: make it with --harness "
                       "upstream_tests", EXIT_USAGE)
    cmd = [*HARNESSES[verb]]
    if verb in ("tune", "gpu_test", "bench", "upstream_tests"):
        ab = verb in ("gpu_test", "upstream_tests")  # patched against upstream
        if verb == "tune":
            cmd += ["--stack", stack]
        if verb == "upstream_tests":
            cmd += ["--tests", str(kit / str(data["upstream_tests"]))]
        cmd += ["--wheel-dir", f"patched={kit / patched['flashinfer']}"]
        upstream = data.get("upstream") or {}
        if ab and "flashinfer" in upstream:
            cmd += ["--wheel-dir", f"unpatched={kit / upstream['flashinfer']}"]
        for name, folder in (data.get("prebuilt") or {}).items():
            if ab or name == "patched":
                cmd += ["--prebuilt", f"{name}={kit / folder}"]
        return [*cmd, *extra, *args], env
    if verb == "sglang_layer":
        if PLUGIN_ROUTE in args:
            return [*plugin_route_command(kit, data, home), *extra,
                    *(a for a in args if a != PLUGIN_ROUTE)], env
        return [*cmd, "--stack-dir", str(kit / "stack"), *extra, *args], env
    # doctor: beside the stack's patched wheels, as a user's SGLang install would have them
    site = home / "doctor-site"
    wheels = [kit / str(w) for w in patched.values()]
    marker = site / ".installed"
    key = "\n".join(str(w) for w in wheels)
    if not (marker.is_file() and marker.read_text() == key):
        if _run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                 "--no-compile", "--upgrade", "--target", site, *wheels]) != 0:
            raise KitError("installing the stack's wheels for the doctor failed")
        marker.write_text(key)
    env["PYTHONPATH"] = str(site)
    if not _given(args, "--python"):  # the doctor's own choice is python3 on PATH
        env["SM120FORK_DOCTOR_EXAMINES"] = "the kit's venv, beside the stack's wheels"
    return [*cmd, *args], env


def plugin_route_command(kit: Path, data: KitJson, home: Path) -> list[str]:
    """``sglang-layer`` on stock SGLang (unpacked once under ``home``) with the plugin
    applied by SGLang's ``load_plugins()``; the notes name both wheels' sha256."""
    route = data["plugin_route"]
    shas = {w["file"]: w["sha256"] for w in data["wheels"]}
    stock = kit / route["sglang"]
    tree = home / "plugin-route" / "sglang"
    marker = tree / ".unpacked-from"
    if not (marker.is_file() and marker.read_text(encoding="utf-8") == shas[route["sglang"]]):
        shutil.rmtree(tree, ignore_errors=True)
        with zipfile.ZipFile(stock) as zf:
            zf.extractall(tree)
        marker.write_text(shas[route["sglang"]], encoding="utf-8")
    notes = [f"plugin route: {what} {Path(route[k]).name} sha256 {shas[route[k]]}"
             for what, k in (("stock", "sglang"), ("the plugin", "plugin"))]
    return [*HARNESSES["sglang_layer"], "--sglang-path", str(tree), "--load-plugins",
            *(x for n in notes for x in ("--note", n))]


def _without(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """``args`` less the options ``names`` and their values."""
    out: list[str] = []
    skip = False
    for arg in args:
        if not skip and arg not in names and not arg.startswith(tuple(n + "=" for n in names)):
            out.append(arg)
        skip = not skip and arg in names
    return out


USAGE = f"usage: sh DIR/run {{{','.join(VERBS)}}} [ARGS...]   (ARGS: the harness's own; --help)"


def main(argv: Sequence[str] | None = None, kit: Path | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    kit = Path(__file__).resolve().parent if kit is None else kit
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else EXIT_USAGE
    verb, rest = args[0], args[1:]
    try:
        if verb == "see-host":
            if len(rest) != 1:
                raise KitError("usage: boot.py see-host PYTHON", EXIT_USAGE)
            print(see_host(rest[0]))
            return 0
        if verb not in VERBS:
            raise KitError(f"unknown verb {verb!r}: {USAGE}", EXIT_USAGE)
        if _read(kit / KIT_FILE, KIT_FORMAT, PARTS_FORMAT)["format"] == PARTS_FORMAT:
            try:
                kit = join(kit, read_parts(kit))
            except OSError as exc:  # a read-only medium, a full disk
                raise KitError(f"could not join the parts beside {kit}: {exc}: copy them "
                               "to a writable folder with room for the kit, then run "
                               "again") from None
        data = load(kit)
        home = Path(os.environ.get("SM120FORK_KIT_HOME") or kit / ".box").absolute()
        home.mkdir(parents=True, exist_ok=True)
        python = prepare(kit, data, verb, home, plugin_route=PLUGIN_ROUTE in rest)
        cmd, env = harness_command(kit, data, verb, rest, home)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    full = {**os.environ, **env}
    if "PYTHONPATH" in env and os.environ.get("PYTHONPATH"):
        full["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + os.environ["PYTHONPATH"]
    return _run([python, "-m", *cmd], env=full)


if __name__ == "__main__":
    sys.exit(main())
