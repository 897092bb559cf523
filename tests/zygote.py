"""A forking pre-import server for the suite's child interpreters (test machinery only).

The probes and ranks the toolkit starts against real SGLang trees are fresh interpreters
(``python -m MODULE ...``), and each spends most of its 6-8 CPU-seconds importing torch and
the libraries SGLang imports, not the tree under test.  The session fixture
``zygote_python`` hands tests an executable, ``zpython``, to pass as the toolkit's
``python``: run as ``zpython -m MODULE ARGS``, ``zpython -c CODE ARGS`` or ``zpython
SCRIPT ARGS``, it asks a server, one per environment, that imported :data:`PRELOAD` once
to fork a child that runs exactly that, with the caller's stdin/stdout/stderr, working
directory and environment, and exits with the child's status; the caller's SIGTERM,
SIGINT and SIGHUP reach the child, and a caller killed outright takes the child (and its
process group) with it.  Any other command line (an interpreter option such as ``-S``)
runs the real interpreter, as does any failure to reach a server: the toolkit's code is
the same either way, only the imports of the pre-imported libraries are shared.

What is pre-imported is chosen so that a forked child sees what a fresh one sees: torch,
numpy and the other libraries below look at none of the packages the probes stub
(``harness.fake_gpu.GPU_ONLY_PACKAGES``) while they import; transformers does (it records
whether torchvision is installed), so a plain server does not pre-import it.  The toolkit's
probes and CPU ranks (:data:`PREPARED`) and the suite's plugin probe
(:data:`PREPARED_SCRIPTS`) stub those packages first thing (``fake_gpu``),
then import SGLang, which imports transformers: for them a *prepared* server first stubs
them as well (the toolkit's own ``fake_gpu``, with no GPU: each child fakes its own
capability), then imports :data:`PREPARED_IMPORTS` (transformers, about half of such a
child's CPU time).  tests/util/test_zygote.py compares such a probe's output with a fresh
interpreter's, byte for byte.  Nothing of SGLang is pre-imported.  Stdlib only on the
client side: it runs with ``-S``.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

#: Libraries that do not look at the stubbed GPU-only packages while they import.
PRELOAD = ("torch", "numpy", "sympy", "networkx", "openai", "requests", "huggingface_hub",
           "aiohttp", "pydantic")
#: The environment that shapes an interpreter's start or these imports: one server each.
KEY_PREFIXES = ("PYTHON", "TORCH", "OMP_", "MKL_", "CUDA", "HF_", "NUMPY", "OPENAI",
                "TRANSFORMERS", "USE_")
#: The modules whose children stub the GPU-only packages before they import anything
#: else (``harness.fake_gpu``), by their request (argv[1], JSON): a rank on a real GPU
#: imports FlashInfer first.
PREPARED: dict[str, Callable[[dict[str, Any]], bool]] = {
    "sm120fork.layouts.communicator": lambda r: True,
    "sm120fork.layouts.layer_boundary": lambda r: True,
    "sm120fork.gpu.layer.rank": lambda r: r.get("device", "cuda") == "cpu",
}
#: The scripts of this suite that do the same (tests/plugin/plugin_probe.py: it puts the
#: site under test first on sys.path, then calls ``fake_gpu``), by file name.
PREPARED_SCRIPTS = frozenset({"plugin_probe.py"})
#: What a prepared server imports once it stubbed the GPU-only packages.
PREPARED_IMPORTS = ("transformers", "transformers.configuration_utils",
                    "transformers.tokenization_utils_base", "transformers.processing_utils",
                    "transformers.image_processing_utils", "transformers.modeling_utils")
#: A server with no request for this long exits.
IDLE_S = 30.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _key(real: str, env: dict[str, str], prepared: bool = False) -> str:
    shaped = sorted((k, v) for k, v in env.items() if k.startswith(KEY_PREFIXES))
    return hashlib.sha256(json.dumps([real, shaped, prepared]).encode()).hexdigest()[:16]


def preparation(args: list[str]) -> bool:
    """Whether ``args`` (a child's command line) goes to a prepared server."""
    if args and os.path.basename(args[0]) in PREPARED_SCRIPTS:
        return True
    if len(args) < 3 or args[0] != "-m" or args[1] not in PREPARED:
        return False
    try:
        request = json.loads(args[2])
    except ValueError:
        return False
    return isinstance(request, dict) and PREPARED[args[1]](request)


def _exec_real(real: str, args: list[str]) -> None:
    os.execv(real, [real, *args])


def _runnable(args: list[str]) -> bool:
    if len(args) >= 2 and args[0] in ("-m", "-c"):
        return True
    return bool(args) and not args[0].startswith("-")


def _lines(conn: socket.socket) -> list[str]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode().splitlines()


def client(real: str, folder: str, args: list[str]) -> None:
    """``zpython ARGS``: run ARGS in a child forked by this environment's server."""
    if not _runnable(args):
        _exec_real(real, args)
    env = dict(os.environ)
    prepared = preparation(args)
    sock_path = os.path.join(folder, _key(real, env, prepared) + ".sock")
    conn = _connect(real, sock_path, env, prepared)
    if conn is None:
        _exec_real(real, args)
        return
    request = json.dumps({"args": args, "env": env, "cwd": os.getcwd()}).encode() + b"\n"
    fds = array.array("i", [0, 1, 2])
    try:
        conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
        started = conn.recv(64)
    except OSError:
        started = b""
    if not started.startswith(b"PID "):  # the server ended before it forked: run it here
        conn.close()
        _exec_real(real, args)
        return

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(f"SIG {signum}\n".encode())

    for sig in FORWARDED:
        signal.signal(sig, forward)
    status = b""
    while not status.endswith(b"\n"):
        try:
            chunk = conn.recv(64)
        except InterruptedError:
            continue
        if not chunk:
            break
        status += chunk
    kind, _, value = status.decode().strip().partition(" ")
    if kind == "SIGNAL":
        signum = int(value)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(int(value) if kind == "EXIT" else 70)


def _connect(real: str, sock_path: str, env: dict[str, str],
             prepared: bool) -> socket.socket | None:
    def attempt() -> socket.socket | None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(sock_path)
        except OSError:
            conn.close()
            return None
        return conn

    with open(sock_path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = attempt()
        if conn is not None:
            return conn
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock_path)
        log = open(sock_path + ".log", "ab")
        server = subprocess.Popen(
            [real, os.path.abspath(__file__), "serve", sock_path, str(int(prepared))],
            env=env,
            cwd=os.path.dirname(sock_path), stdin=subprocess.DEVNULL, stdout=log,
            stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and server.poll() is None:
            conn = attempt()
            if conn is not None:
                return conn
            time.sleep(0.05)
        return None


def serve(sock_path: str, prepared: bool = False) -> None:
    """Import :data:`PRELOAD` (and, ``prepared``, stub the GPU-only packages and import
    :data:`PREPARED_IMPORTS`), then fork a child per request until idle for ``IDLE_S``."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if prepared:
        importlib.import_module("sm120fork.harness.fake_gpu").fake_gpu(None)
        for name in PREPARED_IMPORTS:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    listener.settimeout(IDLE_S)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            break
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            conn.setblocking(True)
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    _log_cpu("server", resource.RUSAGE_SELF)


def _log_cpu(what: str, who: int) -> None:
    """One line ``cpu WHAT USER SYS`` in the server's log: what the suite's own CPU time
    (its workers and their children) does not count."""
    usage = resource.getrusage(who)
    print(f"cpu {what} {usage.ru_utime:.2f} {usage.ru_stime:.2f}", file=sys.stderr, flush=True)


def _handle(conn: socket.socket) -> None:
    """One request: fork the child that runs it, tell the client how it ended."""
    msg, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * 4))
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    while not msg.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            return
        msg += more
    request = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(list(fds), request)  # never returns
    for fd in fds:
        os.close(fd)
    conn.sendall(f"PID {pid}\n".encode())
    import select

    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        readable, _, _ = select.select([conn], [], [], 0.1)
        if readable:
            data = conn.recv(256)
            if not data:  # the client was killed outright: so is its child
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:  # not yet its own group
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            for line in data.decode().splitlines():
                if line.startswith("SIG "):
                    with contextlib.suppress(OSError):
                        os.kill(pid, int(line[4:]))
    _log_cpu(f"child {' '.join(request['args'])[:60]!r}", resource.RUSAGE_CHILDREN)
    if os.WIFSIGNALED(status):
        conn.sendall(f"SIGNAL {os.WTERMSIG(status)}\n".encode())
    else:
        conn.sendall(f"EXIT {os.waitstatus_to_exitcode(status)}\n".encode())


def _child(fds: list[int], request: dict[str, object]) -> None:
    """Become the interpreter the client asked for, as far as a fresh one would differ."""
    import atexit
    import io
    import random
    import runpy
    import threading
    import traceback
    import types

    os.setpgid(0, 0)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    cwd = request["cwd"]
    assert isinstance(cwd, str)
    os.chdir(cwd)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False), encoding="utf-8")
    for name, fd in (("stdout", 1), ("stderr", 2)):
        raw = open(fd, "wb", buffering=0, closefd=False)
        stream = raw if unbuffered else io.BufferedWriter(raw)
        setattr(sys, name, io.TextIOWrapper(
            stream, encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
            line_buffering=fd == 2 or os.isatty(fd), write_through=unbuffered))
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, f"__{name}__", getattr(sys, name))
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    args = request["args"]
    assert isinstance(args, list)
    code = 0
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = cwd
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # as the interpreter ends on one: killed by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:  # as the interpreter does: print it, exit 1
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next
                                  if exc.__traceback__ else None)
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for out in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            out.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "1")
