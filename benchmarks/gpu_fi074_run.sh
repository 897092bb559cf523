#!/usr/bin/env bash
# One leased-GPU call (issue 19 item 6, issue 21 item 1): stack flashinfer-0.7.4's GPU
# evidence, ranks sharing one H200, multicast off, backend trtllm. Both builds JIT their comm
# module once, in parallel, in the first run (~300-350 s); the second starts when they are
# built and loads them from the cache, the two runs then side by side.
#   $OUT/f5-cluster-0.7.4/      the forced-cluster-size variant: an LD_PRELOAD shim
#       (benchmarks/cluster_answer_shim.c) makes cudaOccupancyMaxPotentialClusterSize answer
#       8 under the unchanged builds; the legacy lamport one-shot all-reduce + RMSNorm at
#       hidden 4608 and 5376 (1 and 16 tokens, bf16). Upstream 0.7.4 takes min(heuristic,
#       answer): cluster 5 at 4608 (921-element block offsets, misaligned vector loads) and 6
#       at 5376 (96 of 672 vectors never reduced); the patched build (F5) takes 3 for both.
#       -> reports/gpu/f5-cluster-0.7.4/ (expected: unpatched fails, patched passes)
#   $OUT/flashinfer-0.7.4-h200/ the quick A/B of the published build against upstream 0.7.4
#       with provenance (stack, series digest, the wheel's sha256 and RECORD digest: the
#       record upstream_pr checks) -> reports/gpu/flashinfer-0.7.4-h200/
#   $OUT/carry.log  each carried file checked against its wheel's RECORD; $OUT/summary.txt
# Carries .device/fi074 (benchmarks/gpu_fi074_kit.sh). Usage: bash benchmarks/gpu_fi074_run.sh
# (or the job fi074 of benchmarks/gpu_session.sh). FI074_BUDGET: seconds for everything (575).
# FI074_RUNS=ab: the quick A/B only (the forced-cluster run is already committed);
# FI074_PREBUILT=DIR: DIR/<variant>/trtllm_comm/trtllm_comm.so built on the CPU machine from the
# same wheels (benchmarks/gpu_fi074_prebuild.sh), loaded instead of the JIT (its report says so).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 SM120FORK_SHARED_GPU_HOST=1
F=.device/fi074; R=$PWD/.device/fi074run; OUT=${OUT:?}; T0=$(date +%s)
BUDGET=${FI074_BUDGET:-575}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
rm -rf "$R"; mkdir -p "$R/unpatched" "$R/patched" "$OUT"
{ nvidia-smi -L; python3 -V; nvcc --version | tail -1; echo "checkout $PWD"; echo "out $OUT"
  echo "python $(python3 -c 'import sys; print(sys.executable)')"; } \
  > "$OUT/box.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$R/deps" $F/deps/*.whl || exit 1
UPW=flashinfer_python-0.7.4-py3-none-any.whl
PW=$(basename "$(ls $F/patched/*.files)" .files)
{ python3 benchmarks/gpu_wheel_subset.py unpack $F/upstream "$UPW" "$R/unpatched" &&
  python3 benchmarks/gpu_wheel_subset.py unpack $F/patched "$PW" "$R/patched" --base "$R/unpatched/tree"
} 2>&1 | tee "$OUT/carry.log"
[ -f "$R/patched/$PW" ] && [ -f "$R/unpatched/$UPW" ] || { echo "carry check failed" | tee -a "$OUT/summary.txt"; exit 1; }
rm -rf "$R/unpatched/tree" "$R/patched/tree"
cp $F/patched/manifest.json "$R/patched/"
gcc -shared -fPIC -O2 -o "$R/shim.so" $F/shim/cluster_answer_shim.c \
  -Wl,--version-script=$F/shim/cluster_answer_shim.map -ldl || exit 1
echo "unpacked and checked in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/carry.log"
export PYTHONPATH=$PWD/src:$R/deps  # tvm_ffi, cuda_tile for FlashInfer 0.7.4
LEFT_OUT=$(grep -o "[0-9]* RECORD entries not carried" "$OUT/carry.log" | cut -d' ' -f1 | paste -sd/ -)
CARRY="files of the wheels not carried: the other kernels' sources ($LEFT_OUT RECORD entries of upstream's/our wheel); every carried file was checked against its wheel's RECORD (carry.log)"
NOT_SM12X="SM120/SM121 GPUs: none available here (SM90); F5's arithmetic is architecture-independent"
VARIANTS=(--wheel-dir "patched=$R/patched" --wheel-dir "unpatched=$R/unpatched" --work-dir "$R/g074")
PRE=()
if [ -n "${FI074_PREBUILT:-}" ]; then
  for v in patched unpatched; do PRE+=(--prebuilt "$v=$PWD/$FI074_PREBUILT/$v"); done
  sha256sum "$FI074_PREBUILT"/*/trtllm_comm/trtllm_comm.so | tee -a "$OUT/carry.log"
fi
# the quick A/B of both builds, with provenance: quick_ab BUDGET COMPILE_TIMEOUT KILL_MARGIN
quick_ab() {
  timeout -s TERM -k 10 $(( $1 + $3 )) python3 -m sm120fork.gpu test --quick --world-sizes 2 \
    "${VARIANTS[@]}" "${PRE[@]}" --compile-timeout "$2" --case-timeout 45 --time-budget "$1" \
    --out "$OUT/flashinfer-0.7.4-h200" --not-run "$CARRY" --not-run "$NOT_SM12X" \
    --not-run "FP4 patterns: need sm_100 or newer (skipped on H200)" \
    --not-run "world sizes 4 and 8: one GPU here; the ranks share it" > "$OUT/ab.log" 2>&1
  echo "A/B run rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/summary.txt"
}
if [ "${FI074_RUNS:-all}" = ab ]; then
  quick_ab $(( $(left) - 40 )) 420 30
  tail -n 6 "$OUT/ab.log"
  exit 0
fi
# 1. the forced cluster answer; the module step of both builds happens here (outside
# --time-budget): the JIT, or with FI074_PREBUILT the prebuilt modules loaded
: > "$OUT/f5-cluster.log"
SM120FORK_TEST_CLUSTER_SIZE=8 LD_PRELOAD="$R/shim.so" timeout -s TERM -k 10 $(( $(left) - 20 )) \
  python3 -m sm120fork.gpu test --quick --world-sizes 2 --api custom_lamport --tokens 1,16 \
  --hidden 4608,5376 "${VARIANTS[@]}" "${PRE[@]}" --compile-timeout 420 --case-timeout 30 --time-budget 90 \
  --title "cluster answer forced to 8 (LD_PRELOAD shim)" --out "$OUT/f5-cluster-0.7.4" \
  --not-run "$CARRY" --not-run "$NOT_SM12X" \
  --not-run "world sizes 4 and 8: one GPU here; the ranks share it" > "$OUT/f5-cluster.log" 2>&1 &
P1=$!
# 2. the quick A/B, started once run 1's module step is done (it loads the cached modules);
# the two share the GPU from there, as the ranks of each already do
while kill -0 $P1 2> /dev/null && ! grep -q "module step took" "$OUT/f5-cluster.log"; do sleep 2; done
echo "modules built at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/summary.txt"
B=$(( $(left) - 60 ))
if [ "$B" -gt 30 ]; then
  quick_ab "$B" 120 40
else
  echo "A/B run not started: $B s left" | tee -a "$OUT/summary.txt"
fi
wait $P1
echo "forced-cluster run rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/summary.txt"
# what the device answered, and that the shim replaced it, per launcher block size
grep -h "cluster-answer shim" "$OUT"/f5-cluster-0.7.4/logs/*.log 2>/dev/null | sort | uniq -c \
  > "$OUT/shim-lines.txt"
python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
out, done = Path(sys.argv[1]), True
for name in ("f5-cluster-0.7.4", "flashinfer-0.7.4-h200"):
    path = out / name / "test-ab.json"
    if not path.is_file():
        print(f"{name}: no report"); done = False; continue
    doc = json.loads(path.read_text())
    for variant, recs in doc["results"].items():
        counts = {}
        for r in recs:
            key = "not run" if r.get("not_run") else r["status"]
            counts[key] = counts.get(key, 0) + 1
        print(f"{name}: {variant}: {counts}")
    done = done and bool(doc.get("finished"))
print("finished: every planned case ran" if done else "NOT finished: cases were left out")
PY
echo "all done at $(( $(date +%s) - T0 )) s"
