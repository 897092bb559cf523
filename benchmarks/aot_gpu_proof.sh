#!/usr/bin/env bash
# One leased-GPU call: the AOT wheel on an H200 without nvcc (issue 11).
# Inputs (carried, git-ignored), under $D (default .device/aot): whl/ (apache-tvm-ffi and
# cuda-tile for the GPU box's Python), flashinfer/ (our flashinfer_python wheel), aot/ (the
# AOT wheel built from the same tree), src/ (this toolkit's src/).
#   1. with the AOT wheel: nvcc off PATH, CUDA_HOME unset, FLASHINFER_DISABLE_JIT=1 (a JIT
#      attempt raises instead of compiling), fresh workspace: one fused case, timed from
#      process start to its end; then checked that the workspace holds no compiled object.
#   2. without it: the same one case with nvcc, JIT-compiling the module (in the background
#      from here on, its own fresh workspace).
#   3. with the AOT wheel again (still no nvcc): `gpu test --quick --world-sizes 2`, while
#      leg 2 compiles on the CPU cores.
# Outputs: $OUT/timings.json, the logs, $OUT/reports.tgz (the gpu test report folders).
set -uo pipefail
export SM120FORK_SHARED_GPU_HOST=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=${D:-.device/aot}
OUT=${OUT:-/tmp/out}
QUICK_BUDGET=${QUICK_BUDGET:-120}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "$D"/whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/aotsite "$D"/aot/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/fisite "$D"/flashinfer/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1
NVCC=$(command -v nvcc)
CUDA_BIN=$(dirname "$NVCC")
NO_NVCC_PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -x -F "$CUDA_BIN" | paste -sd:)
ONE=(--quick --world-sizes 2 --api fusion_unified --pattern ar_rmsnorm --tokens 1
     --max-cases 1 --wheel-dir patched="$D"/flashinfer)
now() { date +%s.%N; }

with_aot() {  # no nvcc, no CUDA_HOME, JIT disabled, the AOT wheel importable
  env -u CUDA_HOME -u CUDA_PATH PATH="$NO_NVCC_PATH" FLASHINFER_DISABLE_JIT=1 \
    PYTHONPATH="/tmp/aotsite:/tmp/site:$D/src" "$@"
}
{
  echo "nvcc normally: $NVCC"
  with_aot sh -c 'echo "nvcc with the AOT wheel: $(command -v nvcc || echo none)"'
  # FlashInfer's own answer: where it loads trtllm_comm from, and whether it is prebuilt.
  with_aot env PYTHONPATH="/tmp/aotsite:/tmp/fisite:/tmp/site" FLASHINFER_WORKSPACE_BASE=/tmp/envws \
    python3 -c "import flashinfer, flashinfer_jit_cache as j
from flashinfer.jit import env
from flashinfer.jit.comm import gen_trtllm_comm_module
s = gen_trtllm_comm_module()
print('flashinfer', flashinfer.__version__, '| flashinfer_jit_cache', j.__version__, j.BUILT_BY)
print('aot dir', env.FLASHINFER_AOT_DIR, '| module', s.aot_path, '| is_aot', s.is_aot)"
} > "$OUT/env.log" 2>&1

A0=$(now)
with_aot python3 -m sm120fork.gpu test "${ONE[@]}" --work-dir /tmp/legA --out /tmp/r/first-aot \
  > "$OUT/first-aot.log" 2>&1
A_RC=$?
A1=$(now)
A_OBJECTS=$(find /tmp/legA -name '*.o' -o -name 'trtllm_comm.so' | wc -l)

(
  B0=$(now)
  PYTHONPATH="/tmp/site:$D/src" python3 -m sm120fork.gpu test "${ONE[@]}" --work-dir /tmp/legB \
    --out /tmp/r/first-jit > "$OUT/first-jit.log" 2>&1
  echo "$? $B0 $(now) $(find /tmp/legB -name 'trtllm_comm.so' | wc -l)" > /tmp/legB.done
) &
B_PID=$!

with_aot python3 -m sm120fork.gpu test --quick --world-sizes 2 --wheel-dir patched="$D"/flashinfer \
  --work-dir /tmp/legA --time-budget "$QUICK_BUDGET" --case-timeout 30 --out /tmp/r/quick-aot \
  --not-run "unpatched variant: its module would need nvcc; this run proves the prebuilt one" \
  > "$OUT/quick-aot.log" 2>&1
Q_RC=$?
Q_OBJECTS=$(find /tmp/legA -name '*.o' -o -name 'trtllm_comm.so' | wc -l)
wait "$B_PID"
read -r B_RC B0 B1 B_SO < /tmp/legB.done
python3 - "$A0" "$A1" "$A_RC" "$A_OBJECTS" "$B0" "$B1" "$B_RC" "$B_SO" "$Q_RC" "$Q_OBJECTS" \
  > "$OUT/timings.json" <<'EOF'
import json, sys
a0, a1, arc, aobj, b0, b1, brc, bso, qrc, qobj = sys.argv[1:]
print(json.dumps({
    "with_aot": {"seconds": round(float(a1) - float(a0), 1), "rc": int(arc),
                 "compiled_objects_in_workspace": int(aobj),
                 "how": "alone on the machine; nvcc off PATH, CUDA_HOME unset, "
                        "FLASHINFER_DISABLE_JIT=1"},
    "without_aot": {"seconds": round(float(b1) - float(b0), 1), "rc": int(brc),
                    "jit_built_modules": int(bso),
                    "how": "nvcc on PATH, JIT from a fresh workspace; ran while the quick "
                           "test (with the AOT wheel) used the GPU"},
    "quick_with_aot": {"rc": int(qrc), "compiled_objects_in_workspace": int(qobj)},
    "measure": "wall seconds from launching `python3 -m sm120fork.gpu test` (one fused "
               "allreduce+residual+RMSNorm case, world size 2 sharing the GPU) to its exit",
}, indent=1))
EOF
tar czf "$OUT/reports.tgz" -C /tmp/r . 2>/dev/null
cat "$OUT/timings.json"
tail -3 "$OUT/quick-aot.log"
ls -la "$OUT"
