"""Do peer writes really arrive?  A bounded-time write-and-read-back through CUDA IPC.

``cuDeviceCanAccessPeer`` can say yes on a platform whose IOMMU/ACS drops peer writes;
the fused kernel's lamport spin loops would then hang with no error.  So: one process
per GPU (two on GPU 0 when there is only one) allocates a buffer with a slot per peer
and publishes its IPC handle; every process opens the others' handles, as the fused
kernel's workspace does, and a kernel on its own GPU writes a pattern into its slot of
each peer's buffer; then each process reads its own buffer back.  Every step has a
deadline; a process that misses it is killed and its pairs are reported as timed out.

The parent speaks to the children in JSON lines over stdin/stdout.  Run a child with
``python -m <package>.doctor.ipc <device>``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from .cuda import CudaError, Driver

SLOT = 1024  # 32-bit words per (writer, owner) slot


def seed(writer: int, owner: int) -> int:
    return 0x5EED0000 | (writer << 8) | owner


@dataclass(frozen=True, kw_only=True)
class PairResult:
    writer: int      # process index (its GPU is devices[writer])
    owner: int
    writer_gpu: int
    owner_gpu: int
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"writer_gpu": self.writer_gpu, "owner_gpu": self.owner_gpu, "ok": self.ok,
                "detail": self.detail}


def _child(device: int) -> int:
    """One probe process: allocate, publish, write into peers, read back its own slots."""
    def say(**msg: Any) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    try:
        drv = Driver()
        drv.use(device)
        first = json.loads(sys.stdin.readline())
        me, slots = int(first["index"]), int(first["slots"])
        base = drv.alloc_zeroed(slots * SLOT * 4)
        say(handle=drv.ipc_handle(base).hex())
        peers = json.loads(sys.stdin.readline())["peers"]
        errors: dict[str, str] = {}
        for owner, handle in peers:
            try:
                remote = drv.ipc_open(bytes.fromhex(handle))
                drv.write_pattern(remote + me * SLOT * 4, SLOT, seed(me, int(owner)))
            except CudaError as exc:
                errors[str(owner)] = str(exc)
        say(written=errors)
        sys.stdin.readline()  # "check"
        received: dict[str, str] = {}
        for writer in range(slots):
            if writer == me:
                continue
            words = drv.read_u32(base + writer * SLOT * 4, SLOT)
            bad = sum(1 for k, w in enumerate(words) if w != (k ^ seed(writer, me)))
            received[str(writer)] = "ok" if bad == 0 else f"{bad} of {SLOT} words missing"
        say(received=received)
    except (CudaError, ValueError, KeyError) as exc:
        say(error=str(exc))
        return 1
    return 0


class _Children:
    def __init__(self, devices: Sequence[int], module: str, deadline: float) -> None:
        self.deadline = deadline
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.procs = [subprocess.Popen([sys.executable, "-m", module, str(d)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True, env=env)
                      for d in devices]

    def send(self, index: int, msg: Any) -> None:
        stdin = self.procs[index].stdin
        assert stdin is not None
        stdin.write((msg if isinstance(msg, str) else json.dumps(msg)) + "\n")
        stdin.flush()

    def receive(self, index: int) -> dict[str, Any]:
        stdout: IO[str] | None = self.procs[index].stdout
        assert stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            if not sel.select(timeout=max(0.0, self.deadline - time.monotonic())):
                raise TimeoutError
        line = stdout.readline()
        if not line:
            raise EOFError
        msg: dict[str, Any] = json.loads(line)
        return msg

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()


def probe(devices: Sequence[int], *, timeout: float = 60.0,
          module: str = f"{__package__}.ipc") -> list[PairResult]:
    """Write-and-read-back for every ordered pair of the probe processes on ``devices``."""
    n = len(devices)
    children = _Children(devices, module, time.monotonic() + timeout)
    handles: dict[int, str] = {}
    failed: dict[int, str] = {}
    written: dict[int, dict[str, str]] = {}
    received: dict[int, dict[str, str]] = {}

    def step(i: int, msg: Any, key: str) -> Any:
        if i in failed:
            return None
        try:
            if msg is not None:
                children.send(i, msg)
            reply = children.receive(i)
        except TimeoutError:
            failed[i] = f"no answer within {timeout:.0f}s (a hang: peer writes never completed?)"
            return None
        except (EOFError, BrokenPipeError, ValueError):
            failed[i] = "the probe process died"
            return None
        if "error" in reply:
            failed[i] = str(reply["error"])
            return None
        return reply.get(key)

    try:
        for i in range(n):
            value = step(i, {"index": i, "slots": n}, "handle")
            if value is not None:
                handles[i] = str(value)
        for i in range(n):
            peers = [[j, h] for j, h in handles.items() if j != i]
            value = step(i, {"peers": peers}, "written")
            if value is not None:
                written[i] = dict(value)
        for i in range(n):
            value = step(i, "check", "received")
            if value is not None:
                received[i] = dict(value)
    finally:
        children.close()

    results = []
    for w in range(n):
        for o in range(n):
            if w == o:
                continue
            if w in failed or o in failed:
                ok, detail = False, failed.get(w) or failed[o]
            elif str(o) in written.get(w, {}):
                ok, detail = False, written[w][str(o)]
            else:
                detail = received.get(o, {}).get(str(w), "not read back")
                ok = detail == "ok"
                if ok:
                    detail = f"{SLOT} words written and read back"
            results.append(PairResult(writer=w, owner=o, writer_gpu=devices[w],
                                      owner_gpu=devices[o], ok=ok, detail=detail))
    return results


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1])))
