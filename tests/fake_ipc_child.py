"""A stand-in for ``doctor.ipc``'s child that speaks its protocol over files, not GPUs.

"Device memory" is a file of 32-bit words in $FAKE_IPC_DIR; the "IPC handle" is that
file's name.  FAKE_IPC_DROP=<device> drops the writes of the process on that device
(as an IOMMU that swallows peer writes does); FAKE_IPC_HANG=<device> never answers.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path

from sm120fork.doctor.ipc import SLOT, seed


def main() -> int:
    device = int(sys.argv[1])
    root = Path(os.environ["FAKE_IPC_DIR"])
    if os.environ.get("FAKE_IPC_HANG") == str(device):
        time.sleep(3600)
    first = json.loads(sys.stdin.readline())
    me, slots = int(first["index"]), int(first["slots"])
    mine = root / f"buf{me}"
    mine.write_bytes(bytes(slots * SLOT * 4))
    print(json.dumps({"handle": mine.name.encode().hex()}), flush=True)
    peers = json.loads(sys.stdin.readline())["peers"]
    for owner, handle in peers:
        data = b"".join(struct.pack("<I", k ^ seed(me, int(owner))) for k in range(SLOT))
        if os.environ.get("FAKE_IPC_DROP") == str(device):
            continue
        with open(root / bytes.fromhex(handle).decode(), "r+b") as f:
            f.seek(me * SLOT * 4)
            f.write(data)
    print(json.dumps({"written": {}}), flush=True)
    sys.stdin.readline()
    words = mine.read_bytes()
    received = {}
    for writer in range(slots):
        if writer == me:
            continue
        chunk = struct.unpack(f"<{SLOT}I", words[writer * SLOT * 4:(writer + 1) * SLOT * 4])
        bad = sum(1 for k, w in enumerate(chunk) if w != (k ^ seed(writer, me)))
        received[str(writer)] = "ok" if bad == 0 else f"{bad} of {SLOT} words missing"
    print(json.dumps({"received": received}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
