#!/usr/bin/env bash
# One leased-GPU call (issue 21): the quick A/B with provenance, ranks sharing one H200,
# multicast off, backend trtllm, both stacks at once (separate JIT caches, in parallel):
#   $OUT/h200-1x/          stack sglang-0.5.10: our FlashInfer vs the stock wheel of its pin
#                          -> reports/gpu/h200-1x/test-ab.{json,md} (F4/F6's Verified-By dir)
#   $OUT/sglang-0.5.23-h200/  stack sglang-0.5.23: FlashInfer 0.7.2 as published, the unified
#                          trtllm path SGLang 0.5.23 uses -> reports/gpu/sglang-0.5.23-h200/
# Each test-ab.json records the stack, series digests and the tested wheel (its sha256, and
# for 0.7.2 the RECORD digest of the published wheel its tree was checked against).
# Carries .device/ab (benchmarks/gpu_ab_kit.sh).  Usage: bash benchmarks/gpu_ab_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 SM120FORK_SHARED_GPU_HOST=1
A=.device/ab; R=$PWD/.device/abrun; T0=$(date +%s); OUT=${OUT:?}
rm -rf "$R"; mkdir -p "$R/fi72" "$R/w523"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1; nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-compile --target "$R/deps" $A/deps/*.whl || exit 1
tar xJf $A/sglang-0.5.23/*.tree.tar.xz -C "$R/fi72" || exit 1
python3 benchmarks/gpu_stack2_check_tree.py "$R"/fi72/flashinfer_python-0.7.2 \
  "$(cat $A/sglang-0.5.23/record.sha256)" "$R/w523/flashinfer_python-0.7.2-py3-none-any.whl" \
  2>&1 | tee "$OUT/fi72-carry.log" || exit 1
cp $A/sglang-0.5.23/manifest.json "$R/w523/"
echo "unpacked in $(( $(date +%s) - T0 )) s"
export PYTHONPATH=$PWD/src:$R/deps  # tvm_ffi, cuda_tile for FlashInfer 0.7.2
NOT_SM12X="SM120/SM121 GPUs: none available here; on SM90 this checks F4 and F6 and that nothing regresses, not the SM12x-only fixes (F1, F3, F5)"
timeout -s TERM 470 python3 -m sm120fork.gpu test --quick --world-sizes 2 \
  --wheel-dir patched=$A/sglang-0.5.10 --wheel-dir unpatched=$A/sglang-0.5.10/upstream \
  --work-dir "$R/g510" --case-timeout 60 --time-budget 210 --out "$OUT/h200-1x" \
  --not-run "FP4 patterns: need sm_100 or newer (skipped on H200)" --not-run "$NOT_SM12X" \
  --not-run "world sizes 4 and 8: one GPU here; the ranks share it" > "$OUT/ab-0.5.10.log" 2>&1 &
timeout -s TERM 470 python3 -m sm120fork.gpu test --quick --world-sizes 2 --api fusion_unified \
  --wheel-dir published="$R/w523" --primary published \
  --work-dir "$R/g523" --case-timeout 60 --time-budget 210 --out "$OUT/sglang-0.5.23-h200" \
  --not-run "A/B against another FlashInfer: 0.7.2 needs no patch, so only the published wheel is run" \
  --not-run "SM120/SM121 GPUs: none available here (SM90)" \
  --not-run "FP4 patterns: need sm_100 or newer" > "$OUT/ab-0.5.23.log" 2>&1 &
wait -n; echo "first done at $(( $(date +%s) - T0 )) s"; wait
echo "all done at $(( $(date +%s) - T0 )) s"; tail -5 "$OUT"/ab-*.log
# At most 8 files come back: everything travels in one archive too (rank logs included);
# beside it only the two reports and the two run logs.
tar czf "$R/all.tgz" -C "$OUT" . && mv "$R/all.tgz" "$OUT/"
find "$OUT" -mindepth 2 -type d -name logs -exec rm -rf {} +
rm -f "$OUT/nvidia-smi.txt" "$OUT/fi72-carry.log"
find "$OUT" -type f | sort
