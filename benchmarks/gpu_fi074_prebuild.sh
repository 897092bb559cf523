#!/usr/bin/env bash
# The comm module of both stack flashinfer-0.7.4 builds, compiled on the CPU machine for the
# H200 (sm_90a) with FlashInfer's own JIT build (sm120fork.aot.compile: the wheel's gen_trtllm_comm_module
# spec, its flags and ninja; nvcc 13.0 as on the GPU machine), so a device call loads them
# instead of spending ~400 s on the JIT:
#   .device/pb074/{patched,unpatched}/trtllm_comm/trtllm_comm.so  (+ compiled.json)
# The same wheels as the kit (benchmarks/gpu_fi074_kit.sh): our build from wheels/flashinfer-0.7.4/,
# upstream's published 0.7.4 from .device/kit/flashinfer-0.7.4/upstream/. One compile per core.
# Usage: bash benchmarks/gpu_fi074_prebuild.sh   (then FI074_PREBUILT=.device/pb074 FI074_RUNS=ab)
set -euo pipefail
cd "$(dirname "$0")/.."
W=.device/pb074-work; O=.device/pb074; PY=${PYTHON:-python3}
declare -A WHEEL=([patched]=$(ls wheels/flashinfer-0.7.4/flashinfer_python-0.7.4+sm120.1-py3-none-any.whl)
                  [unpatched]=$(ls .device/kit/flashinfer-0.7.4/upstream/flashinfer_python-0.7.4-py3-none-any.whl))
mkdir -p "$W" "$O"
for v in patched unpatched; do
  rm -rf "${W:?}/$v/site"; "$PY" -m pip install -q --no-deps --no-compile --target "$W/$v/site" "${WHEEL[$v]}"
  PYTHONPATH=$PWD/src "$PY" - "$W/$v" "$O/$v" > "$W/$v.log" 2>&1 <<'PY' &
import json, logging, shutil, sys
from pathlib import Path
from sm120fork.aot import compile as c, toolchain
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
work, out = Path(sys.argv[1]), Path(sys.argv[2])
built = c.build(work / "site", ["9.0a"], toolchain.prepare(work / "link"), work / "cache", jobs=1)
(out / "trtllm_comm").mkdir(parents=True, exist_ok=True)
shutil.copy2(built.so, out / "trtllm_comm" / "trtllm_comm.so")
(out / "compiled.json").write_text(json.dumps(built.to_dict(), indent=1))
print("built", built.plan.targets, f"{built.wall_seconds:.0f} s")
PY
done
wait
tail -n 1 "$W"/*.log; sha256sum "$O"/*/trtllm_comm/trtllm_comm.so
