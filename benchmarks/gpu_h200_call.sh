#!/usr/bin/env bash
# One leased-GPU call on H200s: A/B correctness of the patched vs unpatched FlashInfer
# wheels, then a bench of the patched wheel, then (optionally) the custom all-reduce
# cases at world size 8.  With fewer GPUs than ranks, ranks share GPUs.
# Inputs (carried, git-ignored): .whl/ (apache-tvm-ffi, cuda-tile for the GPU box's
# Python), .device/wheels/{patched,unpatched}/flashinfer_python-*.whl (patched: copied
# from wheels/sglang-0.5.10/ with its manifest.json, which the reports record) and, optionally,
# .device/aot.tar.xz with <variant>/<module>/<module>.so prebuilt from the same wheels
# (JIT compilation takes over when they do not load).  Outputs: $OUT/<NAME>.tgz with
# the report directories, plus the console logs.
set -uo pipefail
export SM120FORK_SHARED_GPU_HOST=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NAME=${NAME:-h200-1x}
WS=${WS:-2,4}
MATRIX=${MATRIX:---quick}
TEST_BUDGET=${TEST_BUDGET:-420}
BENCH_WS=${BENCH_WS:-2}
BENCH_MATRIX=${BENCH_MATRIX---quick}
BENCH_BUDGET=${BENCH_BUDGET:-100}
WS8_BUDGET=${WS8_BUDGET:-0}
CASE_TIMEOUT=${CASE_TIMEOUT:-30}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
PRE=()
if [ -f .device/aot.tar.xz ]; then
  mkdir -p /tmp/aot && tar xJf .device/aot.tar.xz -C /tmp/aot
  for v in patched unpatched; do [ -d /tmp/aot/$v ] && PRE+=(--prebuilt $v=/tmp/aot/$v); done
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >> "$OUT/nvidia-smi.txt" 2>&1
# FlashInfer's norm module (the unfused baseline's kernel) needs cublasLt.h, which the CPU
# machines lack, so it is JIT-built here, in the background, into the patched variant's
# JIT cache while the correctness run uses the GPU.
WORK=${SM120FORK_GPU_WORK:-/tmp/sm120fork-gpu}
( python3 -m pip install -q --no-index --no-deps --target /tmp/normsite \
    .device/wheels/patched/*.whl && PYTHONPATH=/tmp/normsite:/tmp/site \
  FLASHINFER_WORKSPACE_BASE=$WORK/patched/jit python3 -c "import torch
from flashinfer.norm import fused_add_rmsnorm as f
x = torch.randn(2, 256, device='cuda', dtype=torch.bfloat16)
f(x, torch.randn_like(x), torch.ones(256, device='cuda', dtype=torch.bfloat16))
torch.cuda.synchronize(); print('norm module ready')" ) > "$OUT/norm-build.log" 2>&1 &
NORM_PID=$!
R=$OUT/$NAME
AB=(--wheel-dir patched=.device/wheels/patched --wheel-dir unpatched=.device/wheels/unpatched)
NOTES=(--not-run "FP4 patterns: need sm_100 or newer (skipped on H200)"
  --not-run "SM120/SM121 GPUs: none available here; on SM90 this checks F4 and F6 and that nothing regresses, not the SM12x-only fixes (F1, F3, F5)")
python3 -m sm120fork.gpu test $MATRIX --world-sizes "$WS" "${AB[@]}" "${PRE[@]}" \
  --case-timeout "$CASE_TIMEOUT" --time-budget "$TEST_BUDGET" --out "$R" "${NOTES[@]}" \
  2>&1 | tee "$OUT/test.log"
wait "$NORM_PID"
BPRE=()
[ -d /tmp/aot/patched ] && BPRE=(--prebuilt patched=/tmp/aot/patched)
python3 -m sm120fork.gpu bench $BENCH_MATRIX --world-size "$BENCH_WS" \
  --wheel-dir patched=.device/wheels/patched "${BPRE[@]}" --case-timeout 60 \
  --time-budget "$BENCH_BUDGET" --out "$R" 2>&1 | tee "$OUT/bench.log"
DIRS=("$NAME")
if [ "$WS8_BUDGET" -gt 0 ]; then
  python3 -m sm120fork.gpu test --quick --world-sizes 8 --api custom_lamport \
    --tokens "${WS8_TOKENS:-1,16}" "${AB[@]}" \
    "${PRE[@]}" --case-timeout "$CASE_TIMEOUT" --time-budget "$WS8_BUDGET" \
    --out "$R-ws8" "${NOTES[@]}" 2>&1 | tee "$OUT/test-ws8.log"
  DIRS+=("$NAME-ws8")
fi
tar czf "$OUT/$NAME.tgz" -C "$OUT" "${DIRS[@]}" && (cd "$OUT" && rm -rf "${DIRS[@]}")
ls -la "$OUT"
