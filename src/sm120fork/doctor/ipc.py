"""Do peer writes and reads really arrive, and how fast?  Per GPU pair, bounded.

``cuDeviceCanAccessPeer`` can say yes where the IOMMU/ACS drops peer traffic, and the fused
kernel's spin loops then hang.  So one process per GPU (two on GPU 0 when alone) shares
memory both ways FlashInfer does (VMM memory as a POSIX FD over SCM_RIGHTS; a legacy CUDA
IPC handle); per pair, each side writes into the other's slot, reads its pattern back and
times a large copy.  A pair that hangs is named and its processes restarted.  A child:
``python -m <package>.doctor.ipc <device> <index> <processes> <socket fd>``; each message
is one packet on that socket, carrying the FD of the VMM memory it names.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar, cast

from ..util import proc, wire
from .cuda import CudaError, Driver
from .facts import Link

SLOT = 1024                  # 32-bit words per pattern (published, and per writer)
BANDWIDTH_BYTES = 32 << 20   # per timed copy
REPEATS = 5
SETUP_TIMEOUT = 60.0         # seconds for a probe process to share its memory


def pattern(writer: int, owner: int) -> list[int]:
    seed = 0x5EED0000 | (writer << 8) | owner
    return [k ^ seed for k in range(SLOT)]


def mismatch(words: Sequence[int], expected: Sequence[int]) -> str:
    bad = sum(1 for w, e in zip(words, expected, strict=True) if w != e)
    return "ok" if bad == 0 else f"{bad} of {SLOT} words wrong"


@dataclass(frozen=True, kw_only=True)
class LinkResult:
    """What process ``writer`` (on ``writer_gpu``) did with the memory of ``owner``."""

    writer: int
    owner: int
    writer_gpu: int
    owner_gpu: int
    #: per sharing kind: {"open": ..., "write": ..., "read": ...}, each "ok" or why not
    sharing: dict[str, dict[str, str]] = field(default_factory=dict)
    write_gbps: float | None = None
    read_gbps: float | None = None
    error: str | None = None     # the pair did not finish (hang, crash, no process)
    seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.sharing) and all(
            v == "ok" for steps in self.sharing.values() for v in steps.values())

    @property
    def detail(self) -> str:
        if self.error is not None:
            return self.error
        bad = [f"{kind} {step}: {v}" for kind, steps in self.sharing.items()
               for step, v in steps.items() if v != "ok"]
        return "; ".join(bad) if bad else "writes and reads arrived (VMM/FD and CUDA IPC)"

    def to_json(self) -> Link:
        return cast(Link, {**asdict(self), "ok": self.ok, "detail": self.detail})


@dataclass(frozen=True)
class Shared:
    """A child's first answer: per sharing kind "ok" or why it has none, and what a peer
    needs to map its memory (the packet carries the VMM memory's FD when it has one)."""

    vmm: str
    ipc: str
    ipc_handle: str = ""
    vmm_size: int = 0


@dataclass(frozen=True)
class Opened:
    """A writer's answer to OPEN (map ``peer``'s memory, write into it, read it back,
    time copies): per sharing kind {"open", "write", "read"}, and the copies' speed."""

    sharing: dict[str, dict[str, str]]
    write_gbps: float | None = None
    read_gbps: float | None = None


@dataclass(frozen=True)
class Checked:
    """An owner's answer to CHECK: per sharing kind, does ``writer``'s slot hold what
    ``writer`` wrote?"""

    slots: dict[str, str]


def _send(sock: socket.socket, tag: str, data: object, fd: int | None = None) -> None:
    socket.send_fds(sock, [wire.encode(tag, data).encode()], [] if fd is None else [fd])


def _receive(sock: socket.socket) -> tuple[str, int | None]:
    """The next packet's line and the FD it carries; EOFError once the other side is gone."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
    if not data:
        raise EOFError
    return data.decode("utf-8", "replace"), fds[0] if fds else None


def _answer(sock: socket.socket, answer: Shared | Opened | Checked, fd: int | None = None
            ) -> None:
    _send(sock, type(answer).__name__.upper(), asdict(answer), fd)


def _slot(base: int, writer: int) -> int:
    """A buffer is [published pattern][one slot per writer][bandwidth (VMM only)]."""
    return base + (1 + writer) * SLOT * 4


def _size(processes: int, with_bandwidth: bool) -> int:
    return (1 + processes) * SLOT * 4 + (BANDWIDTH_BYTES if with_bandwidth else 0)


def _given(fd: int | None) -> int:
    if fd is None:
        raise CudaError("the peer's VMM memory came without its FD")
    return fd


class _Child:
    """One probe process: its memory shared both ways, then the parent's steps served."""

    def __init__(self, device: int, me: int, processes: int) -> None:
        self.drv = Driver()
        self.drv.use(device)
        self.device, self.me, self.processes = device, me, processes
        self.blocks = 4 * self.drv.attribute(device, 16)
        self.mine: dict[str, int] = {}

    def share(self) -> tuple[Shared, int | None]:
        drv, fd, size, handle = self.drv, None, 0, ""
        vmm = ipc = "ok"
        try:
            buffer = drv.vmm_alloc(self.device, _size(self.processes, True))
            self.mine["vmm"], fd, size = buffer.ptr, buffer.fd, buffer.size
        except CudaError as exc:
            vmm = str(exc)
        try:
            self.mine["ipc"] = drv.alloc_zeroed(_size(self.processes, False))
            handle = drv.ipc_handle(self.mine["ipc"]).hex()
        except CudaError as exc:
            ipc = str(exc)
        for base in self.mine.values():
            drv.write_u32(base, pattern(self.me, self.me))
        self.staging = drv.alloc_zeroed(SLOT * 4)
        self.local_bw = drv.alloc_zeroed(BANDWIDTH_BYTES)
        return Shared(vmm=vmm, ipc=ipc, ipc_handle=handle, vmm_size=size), fd

    def _map(self, theirs: Shared, fd: int | None
             ) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
        """The peer's memory mapped here per sharing kind (its VMM memory from ``fd``),
        and each kind's "open" step."""
        remote: dict[str, int] = {}
        result: dict[str, dict[str, str]] = {}
        openers: dict[str, Callable[[], int]] = {
            "vmm": lambda: self.drv.vmm_import(_given(fd), theirs.vmm_size, self.device),
            "ipc": lambda: self.drv.ipc_open(bytes.fromhex(theirs.ipc_handle))}
        for kind, opener in openers.items():
            state = getattr(theirs, kind)
            if state != "ok":
                result[kind] = {"open": f"the peer has none: {state}"}
                continue
            try:
                remote[kind] = opener()
                result[kind] = {"open": "ok"}
            except CudaError as exc:
                result[kind] = {"open": str(exc)}
        return remote, result

    def open(self, peer: int, shared: Shared, fd: int | None) -> Opened:
        drv, blocks = self.drv, self.blocks
        try:
            remote, result = self._map(shared, fd)
        finally:
            if fd is not None:
                os.close(fd)
        bandwidth: dict[str, float] = {}
        for kind, ptr in remote.items():
            try:
                drv.write_u32(self.staging, pattern(self.me, peer))
                drv.copy(_slot(ptr, self.me), self.staging, SLOT * 4, blocks)
                drv.synchronize()
                result[kind]["write"] = "ok"
                drv.copy(self.staging, ptr, SLOT * 4, blocks)
                drv.synchronize()
                result[kind]["read"] = mismatch(drv.read_u32(self.staging, SLOT),
                                                pattern(peer, peer))
                if kind == "vmm":
                    gb, far = BANDWIDTH_BYTES * REPEATS / 1e6, _slot(ptr, self.processes)
                    bandwidth["write_gbps"] = gb / drv.timed_copy(
                        far, self.local_bw, BANDWIDTH_BYTES, REPEATS, blocks)
                    bandwidth["read_gbps"] = gb / drv.timed_copy(
                        self.local_bw, far, BANDWIDTH_BYTES, REPEATS, blocks)
            except CudaError as exc:
                result[kind].setdefault("write", str(exc))
                result[kind].setdefault("read", str(exc))
        return Opened(result, **bandwidth)

    def check(self, writer: int) -> Checked:
        return Checked({kind: mismatch(self.drv.read_u32(_slot(base, writer), SLOT),
                                       pattern(writer, self.me))
                        for kind, base in self.mine.items()})


def _child(device: int, me: int, processes: int, sock_fd: int) -> int:
    """Shares its memory, then answers each OPEN and CHECK request until the parent goes."""
    sock = socket.socket(fileno=sock_fd)
    try:
        child = _Child(device, me, processes)
        _answer(sock, *child.share())
        while True:
            line, fd = _receive(sock)
            message = wire.decode(line)
            if message is not None and message.tag == "OPEN":
                shared = Shared(**message.data["shared"])
                _answer(sock, child.open(message.data["peer"], shared, fd))
            elif message is not None and message.tag == "CHECK":
                _answer(sock, child.check(message.data["writer"]))
    except EOFError:
        return 0
    except (CudaError, ValueError, KeyError, TypeError, OSError, wire.WireError) as exc:
        _send(sock, "FAILED", {"error": str(exc)})
        return 1


_M = TypeVar("_M", Shared, Opened, Checked)


class _Process:
    """One probe child: its end of the socket, what it shared and its VMM memory's FD."""

    def __init__(self, device: int, index: int, processes: int, module: str) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.group = proc.ProcessGroup()   # Ctrl-C (end_children) ends it too
        try:
            self.proc = self.group.start(
                [sys.executable, "-m", module, str(device), str(index), str(processes),
                 str(child.fileno())],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ,
                pass_fds=(child.fileno(),))
        finally:
            child.close()
        self.shared = Shared(vmm="not set up", ipc="not set up")
        self.vmm_fd: int | None = None

    def receive(self, deadline: float, kind: type[_M]) -> _M:
        """The child's next ``kind`` message; the FD one carries is its VMM memory's."""
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            line, fd = _receive(self.sock)
            if fd is not None:
                self.vmm_fd = fd
            try:
                message = wire.decode(line)
            except wire.WireError as exc:
                raise RuntimeError(f"the probe process spoke another wire format: "
                                   f"{exc.what}") from exc
            if message is not None and message.tag == "FAILED":
                raise RuntimeError(str(message.data["error"]))
            if message is not None and message.tag == kind.__name__.upper():
                return kind(**message.data)

    def close(self) -> None:
        self.group.kill()   # with its process group; reaped
        self.sock.close()
        if self.vmm_fd is not None:
            os.close(self.vmm_fd)
            self.vmm_fd = None


#: what a probe process that hangs, dies or answers nonsense raises in the parent
_LOST = (OSError, EOFError, ValueError, RuntimeError)


def _failure(exc: BaseException, timeout: float, doing: str) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:.0f}s while {doing} (a hang)"
    if isinstance(exc, (EOFError, ConnectionError, ValueError)):
        return f"the probe process died while {doing}"
    return f"{doing}: {exc}"


class _Probe:
    def __init__(self, devices: Sequence[int], module: str) -> None:
        self.devices = list(devices)
        self.module = module
        self.procs: dict[int, _Process] = {}
        self.broken: dict[int, str] = {}

    def process(self, i: int) -> _Process | None:
        """Process ``i``, started (again) if needed; None (and why in ``broken``)."""
        if i in self.procs:
            return self.procs[i]
        proc = _Process(self.devices[i], i, len(self.devices), self.module)
        deadline = time.monotonic() + SETUP_TIMEOUT
        try:
            proc.shared = proc.receive(deadline, Shared)
        except _LOST as exc:
            proc.close()
            self.broken[i] = _failure(exc, SETUP_TIMEOUT,
                                      f"setting up on GPU {self.devices[i]}")
            return None
        self.broken.pop(i, None)
        self.procs[i] = proc
        return proc

    def drop(self, *indices: int) -> None:
        for i in indices:
            proc = self.procs.pop(i, None)
            if proc is not None:
                proc.close()

    def pair(self, a: int, b: int, timeout: float) -> list[LinkResult]:
        """Both directions of the pair (a, b), under one deadline of their own."""
        start = time.monotonic()
        deadline = start + timeout
        blank = {(w, o): LinkResult(writer=w, owner=o, writer_gpu=self.devices[w],
                                    owner_gpu=self.devices[o]) for w, o in ((a, b), (b, a))}
        links = dict(blank)
        for i in (a, b):
            if self.process(i) is None:
                why = f"not probed: {self.broken[i]}"
                return [replace(r, error=why) for r in blank.values()]
        opened: dict[tuple[int, int], Opened] = {}
        doing = ""
        try:
            for w, o in links:
                doing = (f"GPU {self.devices[w]} mapped, wrote into and read from "
                         f"GPU {self.devices[o]}'s memory")
                writer, owner = self.procs[w], self.procs[o]
                _send(writer.sock, "OPEN", {"peer": o, "shared": asdict(owner.shared)},
                      owner.vmm_fd)
                opened[(w, o)] = writer.receive(deadline, Opened)
            for w, o in links:
                doing = f"GPU {self.devices[o]} checked what GPU {self.devices[w]} wrote"
                _send(self.procs[o].sock, "CHECK", {"writer": w})
                checked = self.procs[o].receive(deadline, Checked).slots
                done = opened[(w, o)]
                sharing = {kind: dict(steps) for kind, steps in done.sharing.items()}
                for kind, steps in sharing.items():
                    if steps.get("write") == "ok":
                        steps["write"] = checked.get(kind, "not checked")
                links[(w, o)] = replace(blank[(w, o)], sharing=sharing,
                                        write_gbps=done.write_gbps, read_gbps=done.read_gbps)
        except _LOST as exc:
            why = _failure(exc, timeout, doing)
            self.drop(a, b)   # a hung or dead pair must not poison the next pairs
            links = {k: replace(r, error=why) for k, r in blank.items()}
        seconds = round(time.monotonic() - start, 2)
        return [replace(r, seconds=seconds) for r in links.values()]


def probe(devices: Sequence[int], *, pair_timeout: float = 30.0,
          module: str = f"{__package__}.ipc") -> list[LinkResult]:
    """Writes, reads and bandwidth for every pair of probe processes on ``devices``."""
    runner = _Probe(devices, module)
    try:
        return [link for a, b in itertools.combinations(range(len(devices)), 2)
                for link in runner.pair(a, b, pair_timeout)]
    finally:
        runner.drop(*list(runner.procs))


if __name__ == "__main__":
    sys.exit(_child(*(int(x) for x in sys.argv[1:5])))
