"""The offline kit's entry on the GPU box: ``sh DIR/run VERB [ARGS]`` runs this file.

Standard library only, and it runs from the kit as a plain file (the toolkit is not
installed yet when it starts).  It makes one private virtual environment under the kit
(``DIR/.box/``, or ``$SM120FORK_KIT_HOME``) that also sees the packages of the Python that
runs it (where the box's CUDA torch lives, built for its driver: a ``.pth`` file names that
Python's site folders, which works whether that Python is a system one or itself a venv),
installs into it the kit's wheels for VERB with ``pip --no-index --find-links DIR/wheels``
(pip skips what the box already has), and runs the harness there.  Nothing else is
fetched, and nothing outside the private folder and ``--out`` is written.

The nox GPU sessions use :func:`see_host` too (``python src/sm120fork/kit/boot.py
see-host PYTHON``), so a checkout's venv sees the box's torch the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

#: The kit's description, beside this file (written by sm120fork.kit.build).
KIT_FILE = "kit.json"
KIT_FORMAT = "sm120fork-kit/1"
PTH_NAME = "sm120fork-host-site.pth"
VERBS = ("gpu_test", "bench", "sglang_layer", "doctor")
#: Exit codes as the toolkit's errors have them (errors.py): ConfigError, UsageError.
EXIT_CONFIG = 2
EXIT_USAGE = 16


class KitError(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, text: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(text)
        self.code = code


# ---------------------------------------------------------------- the host's packages


def site_dirs(python: str) -> list[str]:
    """The folders ``python`` imports installed packages from (its site-packages, its base's
    when it is a venv with system site packages, its user site)."""
    code = ("import json, site, sys; d = site.getsitepackages() if hasattr(site, "
            "'getsitepackages') else []; u = site.getusersitepackages(); "
            "print(json.dumps([p for p in sys.path if p and (p in d or p == u)]))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KitError(f"{python} does not run: {done.stderr.strip()[-300:]}")
    return [p for p in json.loads(done.stdout) if Path(p).is_dir()]


def see_host(host: str, purelib: str | None = None) -> Path:
    """Make the running interpreter's environment (a venv) see ``host``'s packages too,
    after its own: a ``.pth`` file in its site folder adds ``host``'s site folders as site
    folders (``site.addsitedir``: their own ``.pth`` files count too)."""
    target = Path(purelib or sysconfig.get_paths()["purelib"])
    own = {os.path.realpath(target)}
    dirs = [d for d in site_dirs(host) if os.path.realpath(d) not in own]
    pth = target / PTH_NAME
    pth.write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dirs),
                   encoding="utf-8")
    return pth


# ---------------------------------------------------------------- the kit


def load(kit: Path) -> dict[str, object]:
    path = kit / KIT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KitError(f"{path}: not a kit ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != KIT_FORMAT:
        raise KitError(f"{path}: not a kit of format {KIT_FORMAT}")
    return data


def _python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(cmd: Sequence[str | os.PathLike[str]], **kw: object) -> int:
    print("+ " + shlex.join(os.fspath(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([os.fspath(c) for c in cmd], check=False, **kw).returncode  # type: ignore[call-overload, no-any-return]


def prepare(kit: Path, data: dict[str, object], verb: str, home: Path) -> Path:
    """The private venv with VERB's wheels (made once per kit and verb); its python."""
    want = str(data["python"])
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if have != want:
        raise KitError(f"this kit is for Python {want}, this is Python {have} "
                       f"({sys.executable}): run it with PYTHON=python{want} sh "
                       f"{kit}/run ..., or make a kit with --python {have}")
    requirements = dict(data["requirements"])  # type: ignore[call-overload]
    if verb not in requirements:
        raise KitError(f"this kit carries no {verb} (it has {', '.join(requirements)}): make "
                       f"it with --harness {verb}", EXIT_USAGE)
    reqs = [str(r) for r in requirements[verb]]
    digest = hashlib.sha256(json.dumps([data["wheels"], reqs, sys.executable])
                            .encode()).hexdigest()[:16]
    venv = home / "venv"
    marker = venv / f".installed-{verb}"
    if marker.is_file() and marker.read_text().strip() == digest:
        return _python_of(venv)
    if not _python_of(venv).exists() and _run(
            [sys.executable, "-m", "venv", "--without-pip", venv]) != 0:
            raise KitError(f"could not make a virtual environment in {venv}")
    purelib = subprocess.run(
        [_python_of(venv), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    see_host(sys.executable, purelib)
    # The venv has no pip of its own: the host's, seen through the .pth, installs into it
    # (sys.prefix is the venv), and counts what the host has as installed.
    cmd: list[str | os.PathLike[str]] = [
        _python_of(venv), "-m", "pip", "install", "--no-index", "--find-links", kit / "wheels",
        "--disable-pip-version-check", "--no-warn-script-location", "-q", *reqs]
    if _run(cmd, env={**os.environ, "PIP_CONFIG_FILE": os.devnull}) != 0:
        raise KitError(f"installing the kit's wheels for {verb} failed (see pip's message "
                       "above): the box lacks a package the kit does not carry; make the kit "
                       "again with that package's name in --include")
    marker.write_text(digest + "\n")
    return _python_of(venv)


def _option(args: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def harness_command(kit: Path, data: dict[str, object], verb: str, args: Sequence[str],
                    home: Path) -> tuple[list[str], dict[str, str]]:
    """The harness's arguments (after ``python -m``) and extra environment for VERB."""
    patched = dict(data["patched"])  # type: ignore[call-overload]
    upstream = dict(data.get("upstream") or {})  # type: ignore[call-overload]
    prebuilt = dict(data.get("prebuilt") or {})  # type: ignore[call-overload]
    shown = shlex.join(["sh", f"<kit {data['stack']}>/run", verb,
                        *_without(args, ("--out", "--work-dir"))])
    env = {"SM120FORK_COMMAND": shown}
    out = _option(args, "--out")
    extra: list[str] = []
    if out is None:
        extra += ["--out", str(Path("kit-results") / str(data["stack"]) / verb)]
    if verb in ("gpu_test", "bench"):
        cmd = ["sm120fork.gpu", "test" if verb == "gpu_test" else "bench",
               "--wheel-dir", f"patched={kit / str(patched['flashinfer'])}"]
        if verb == "gpu_test" and "flashinfer" in upstream:
            cmd += ["--wheel-dir", f"unpatched={kit / str(upstream['flashinfer'])}"]
        for name, folder in prebuilt.items():
            if verb == "gpu_test" or name == "patched":
                cmd += ["--prebuilt", f"{name}={kit / str(folder)}"]
        if _option(args, "--work-dir") is None:
            extra += ["--work-dir", str(home / "work")]
        return [*cmd, *extra, *args], env
    if verb == "sglang_layer":
        if _option(args, "--work-dir") is None:
            extra += ["--work-dir", str(home / "work")]
        return ["sm120fork.gpu", "sglang-layer", "--stack-dir", str(kit / "stack"),
                *extra, *args], env
    # doctor: beside the stack's patched wheels, as a user's SGLang install would have them
    site = home / "doctor-site"
    wheels = [kit / str(w) for w in patched.values()]
    marker = site / ".installed"
    key = "\n".join(str(w) for w in wheels)
    if not (marker.is_file() and marker.read_text() == key):
        rc = _run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                   "--no-compile", "--upgrade", "--target", site, *wheels])
        if rc != 0:
            raise KitError("installing the stack's wheels for the doctor failed")
        marker.write_text(key)
    env["PYTHONPATH"] = str(site)
    return ["sm120fork.doctor", *args], env


def _without(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """``args`` less the options ``names`` and their values (they name this box's paths)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(arg.startswith(n + "=") for n in names):
            continue
        out.append(arg)
    return out


USAGE = f"usage: sh DIR/run {{{','.join(VERBS)}}} [ARGS...]   (ARGS: the harness's own; --help)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    kit = Path(__file__).resolve().parent
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
        data = load(kit)
        home = Path(os.environ.get("SM120FORK_KIT_HOME") or kit / ".box").absolute()
        home.mkdir(parents=True, exist_ok=True)
        python = prepare(kit, data, verb, home)
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
