#!/usr/bin/env bash
# One leased-GPU call (single H200, ranks share the GPU): quick A/B correctness of the
# patched vs unpatched FlashInfer wheels, then a quick bench of the patched wheel.
# Inputs (carried, git-ignored): .whl/ (apache-tvm-ffi, cuda-tile for the GPU box's
# Python), .device/wheels/{patched,unpatched}/flashinfer_python-*.whl and, optionally,
# .device/aot.tar.xz with <variant>/<module>/<module>.so prebuilt from the same wheels
# (falls back to JIT compilation when they do not load).  Outputs: $OUT/<NAME>.tgz with
# the report directory, plus the console logs.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
WS=${WS:-2,4}
TEST_BUDGET=${TEST_BUDGET:-420}
BENCH_BUDGET=${BENCH_BUDGET:-100}
NAME=${NAME:-h200-1x}
MATRIX=${MATRIX:---quick}
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
python3 -m sm120fork.gpu test $MATRIX --world-sizes "$WS" \
  --wheel-dir patched=.device/wheels/patched --wheel-dir unpatched=.device/wheels/unpatched \
  "${PRE[@]}" --case-timeout 30 --time-budget "$TEST_BUDGET" --out "$R" \
  --not-run "world size 8: ran only where listed above; multi-GPU machine kinds were withheld" \
  --not-run "FP4 patterns: need sm_100 or newer (skipped on H200)" \
  --not-run "SM120/SM121 GPUs: none available to this project" 2>&1 | tee "$OUT/test.log"
wait "$NORM_PID"
BPRE=()
[ -d /tmp/aot/patched ] && BPRE=(--prebuilt patched=/tmp/aot/patched)
python3 -m sm120fork.gpu bench --quick --world-size 2 --wheel-dir patched=.device/wheels/patched \
  "${BPRE[@]}" --case-timeout 60 --time-budget "$BENCH_BUDGET" --out "$R" \
  --not-run "multi-GPU bench (NCCL baseline, NVLink targets): multi-GPU kinds withheld" \
  2>&1 | tee "$OUT/bench.log"
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && rm -rf "$R"
ls -la "$OUT"
