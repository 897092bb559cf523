"""The real ``doctor.ipc`` child over a stand-in driver whose "device memory" is files.

A VMM allocation is a file in $FAKE_IPC_DIR and its exported handle that file's open
descriptor (so the parent's SCM_RIGHTS relay is exercised for real); a legacy IPC handle
is the file's name.  FAKE_IPC_DROP=<device> drops the copies the process on that device
makes into a peer's memory (as an IOMMU that swallows peer writes does);
FAKE_IPC_HANG=<device>:<owner device> makes the process on <device> hang when it maps
<owner device>'s memory.  FAKE_IPC_OLD_WIRE=<device> makes the process on that device
speak another version of the wire format.  Every process first prints a line on stdout (a
library's noise), which the parent never takes for a message.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from pathlib import Path

from sm120fork.doctor import ipc
from sm120fork.doctor.cuda import VmmBuffer

ROOT = Path(os.environ["FAKE_IPC_DIR"])
STRIDE = 1 << 32


class FakeDriver:
    def __init__(self) -> None:
        self.regions: dict[int, tuple[mmap.mmap, bool]] = {}   # base -> (memory, peer's)
        self.device = -1

    def use(self, index: int) -> None:
        self.device = index

    def attribute(self, index: int, attribute: int) -> int:
        return 2

    def _new(self, path: Path, size: int, peer: bool) -> int:
        with open(path, "r+b") as f:
            memory = mmap.mmap(f.fileno(), size)
        base = (len(self.regions) + 1) * STRIDE
        self.regions[base] = (memory, peer)
        return base

    def _file(self, size: int) -> Path:
        path = ROOT / f"dev{self.device}-pid{os.getpid()}-{len(self.regions)}"
        path.write_bytes(bytes(size))
        return path

    def _at(self, ptr: int) -> tuple[mmap.mmap, int, bool]:
        memory, peer = self.regions[ptr // STRIDE * STRIDE]
        return memory, ptr % STRIDE, peer

    def _hang_if(self, path: str) -> None:
        owner = Path(path).name.split("-")[0].removeprefix("dev")
        if os.environ.get("FAKE_IPC_HANG") == f"{self.device}:{owner}":
            time.sleep(3600)

    def vmm_alloc(self, index: int, nbytes: int) -> VmmBuffer:
        path = self._file(nbytes)
        ptr = self._new(path, nbytes, peer=False)
        return VmmBuffer(ptr=ptr, size=nbytes, fd=os.open(path, os.O_RDWR))

    def vmm_import(self, fd: int, size: int, index: int) -> int:
        path = os.readlink(f"/proc/self/fd/{fd}")
        self._hang_if(path)
        return self._new(Path(path), size, peer=True)

    def alloc_zeroed(self, nbytes: int) -> int:
        return self._new(self._file(nbytes), nbytes, peer=False)

    def ipc_handle(self, ptr: int) -> bytes:
        name = f"dev{self.device}-pid{os.getpid()}-{ptr // STRIDE - 1}"
        return name.encode().ljust(64, b"\0")

    def ipc_open(self, handle: bytes) -> int:
        path = ROOT / handle.rstrip(b"\0").decode()
        self._hang_if(str(path))
        return self._new(path, path.stat().st_size, peer=True)

    def write_u32(self, ptr: int, words: list[int]) -> None:
        memory, offset, _ = self._at(ptr)
        memory[offset:offset + 4 * len(words)] = b"".join(
            w.to_bytes(4, "little") for w in words)

    def read_u32(self, ptr: int, count: int) -> list[int]:
        memory, offset, _ = self._at(ptr)
        data = memory[offset:offset + 4 * count]
        return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]

    def copy(self, dst: int, src: int, nbytes: int, blocks: int = 64) -> None:
        target, at, peer = self._at(dst)
        if peer and os.environ.get("FAKE_IPC_DROP") == str(self.device):
            return
        source, frm, _ = self._at(src)
        target[at:at + nbytes] = source[frm:frm + nbytes]

    def timed_copy(self, dst: int, src: int, nbytes: int, repeats: int, blocks: int) -> float:
        self.copy(dst, src, nbytes, blocks)
        return 10.0

    def synchronize(self) -> None:
        pass


setattr(ipc, "Driver", FakeDriver)  # noqa: B010
ipc.BANDWIDTH_BYTES = 1 << 16   # file-backed copies are slow on a loaded CPU machine

if __name__ == "__main__":
    if os.environ.get("FAKE_IPC_OLD_WIRE") == sys.argv[1]:   # a child of another version
        os.write(int(sys.argv[4]), b'@@sm120fork/0 PROBE {"ready": {}}')   # one packet
    print("a library's stray line on stdout", flush=True)
    sys.exit(ipc._child(*(int(x) for x in sys.argv[1:5])))
