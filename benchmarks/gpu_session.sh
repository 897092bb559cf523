#!/usr/bin/env bash
# One leased-GPU call that runs several of the device scripts in benchmarks/ side by side, each
# with its own $OUT folder, returned as one archive a job (a call returns at most 8 files).
# They share the one GPU (and its 16 cores for their module builds): correctness only, which
# is all any of them claims there. Every script sets the multicast switches itself; they are
# set here too, for every process started from here.
# Usage: bash benchmarks/gpu_session.sh [--budget S] JOB...
#   JOB: doctor | ab-s510 | ab-s523 | bench-s510 | bench-s523 | failclosed-s510 | failclosed-s523 |
#        failclosed-s523-plugin | aot | fi074
#   fi074 (benchmarks/gpu_fi074_run.sh) carries its own kit, .device/fi074
#   (benchmarks/gpu_fi074_kit.sh), and JITs two comm modules on the 16 cores: give it a
#   call of its own or beside jobs that build nothing.
# Inputs: .device/kit (benchmarks/gpu_kit.sh), carried or left by an earlier call on the same
# warm machine; the per-script kits (.device/doctor, .device/ab, .device/bench) are assembled
# here from it, so no artefact travels twice.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 SM120FORK_SHARED_GPU_HOST=1
BUDGET=560
if [ "${1:-}" = --budget ]; then BUDGET=$2; shift 2; fi
K=.device/kit; TOP=${OUT:?}; T0=$(date +%s)
have() { compgen -G "$1" > /dev/null; }
kit_doctor() {
  rm -rf .device/doctor; mkdir -p .device/doctor/site .device/doctor/plugin
  cp $K/sglang-0.5.10/flashinfer_python-*.whl $K/sglang-0.5.10/sglang-*.whl \
     $K/whl312/common/apache_tvm_ffi-*.whl $K/whl312/common/cuda_tile-*.whl .device/doctor/site/
  if have "$K/sglang-0.5.23/plugin/*.whl"; then cp $K/sglang-0.5.23/plugin/*.whl .device/doctor/plugin/; fi
}
kit_ab() {  # the layout benchmarks/gpu_ab_kit.sh makes
  local A=.device/ab
  # carried ready-made (without .device/kit, when the kit and the other jobs' inputs would not
  # fit one call): keep it
  if ! have "$K/sglang-0.5.*" && [ -d $A/deps ]; then echo "kit_ab: the carried $A"; return 0; fi
  rm -rf $A; mkdir -p $A/sglang-0.5.10/upstream $A/sglang-0.5.23 $A/deps
  cp $K/whl312/common/apache_tvm_ffi-*.whl $K/whl312/common/cuda_tile-*.whl $A/deps/
  if [ -d $K/sglang-0.5.10 ]; then
    cp $K/sglang-0.5.10/manifest.json $K/sglang-0.5.10/flashinfer_python-*.whl $A/sglang-0.5.10/
    cp $K/sglang-0.5.10/upstream/flashinfer_python-*.whl $A/sglang-0.5.10/upstream/
  fi
  if [ -d $K/sglang-0.5.23 ]; then
    cp $K/sglang-0.5.23/manifest.json $K/sglang-0.5.23/flashinfer_python-*.tree.tar.xz $A/sglang-0.5.23/
    cp $K/sglang-0.5.23/flashinfer_python-*.record.sha256 $A/sglang-0.5.23/record.sha256
  fi
}
kit_bench() {  # the layout benchmarks/bench_methods_kit.sh makes
  local B=.device/bench; rm -rf $B; mkdir -p $B/s510 $B/s523 $B/deps
  cp $K/whl312/common/apache_tvm_ffi-*.whl $K/whl312/common/cuda_tile-*.whl $B/deps/
  if [ -d $K/sglang-0.5.10 ]; then
    cp $K/sglang-0.5.10/flashinfer_python-*.whl $K/sglang-0.5.10/manifest.json $B/s510/
  fi
  if have "$K/sglang-0.5.23/flashinfer_python-*.tree.tar.xz"; then
    cp $K/sglang-0.5.23/flashinfer_python-*.tree.tar.xz $B/s523/fi072.tree.tar.xz
    cp $K/sglang-0.5.23/flashinfer_python-*.record.sha256 $B/s523/record.sha256
    cp $K/sglang-0.5.23/manifest.json $B/s523/
  fi
}
ab_s510() {  # the default stack's quick A/B with provenance: our FlashInfer against its pin's stock wheel
  local A=.device/ab R=$PWD/.device/abrun-s510; rm -rf "$R"; mkdir -p "$R"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$R/deps" $A/deps/*.whl || return 1
  PYTHONPATH=$PWD/src:$R/deps python3 -m sm120fork.gpu test --quick --world-sizes 2 \
    --wheel-dir patched=$A/sglang-0.5.10 --wheel-dir unpatched=$A/sglang-0.5.10/upstream \
    --work-dir "$R/g510" --case-timeout 90 --time-budget 240 --out "$OUT/h200-1x" \
    --not-run "FP4 patterns: need sm_100 or newer (skipped on H200)" \
    --not-run "SM120/SM121 GPUs: none available here; on SM90 this checks F4 and F6 and that nothing regresses, not the SM12x-only fixes (F1, F3, F5)" \
    --not-run "world sizes 4 and 8: one GPU here; the ranks share it (and share it with other jobs of this call)"
}
job() {  # name: assemble, run under the budget left, archive
  local name=$1 left; left=$(( BUDGET - ($(date +%s) - T0) ))
  local d=$TOP/$name; mkdir -p "$d"
  case $name in
    doctor) kit_doctor; set -- bash benchmarks/doctor_h200_call.sh ;;
    ab-s510) kit_ab; export -f ab_s510; set -- bash -c ab_s510 ;;
    ab-s523) kit_ab; set -- env AB_STACKS=s523 bash benchmarks/gpu_ab_run.sh ;;
    bench-s510) kit_bench; set -- env BENCH_STACKS=sglang-0.5.10 bash benchmarks/bench_methods_h200_call.sh ;;
    bench-s523) kit_bench; set -- env BENCH_STACKS=sglang-0.5.23 bash benchmarks/bench_methods_h200_call.sh ;;
    failclosed-*) set -- bash benchmarks/gpu_failclosed.sh "${name#failclosed-}" ;;
    aot) set -- bash benchmarks/aot_gpu_proof.sh ;;
    fi074) set -- env FI074_BUDGET=$(( left - 10 )) bash benchmarks/gpu_fi074_run.sh ;;
    *) echo "unknown job $name" >&2; return 2 ;;
  esac
  echo "[$(( $(date +%s) - T0 )) s] $name starts ($left s left): $*"
  OUT=$d timeout -s TERM -k 10 "$left" "$@" > "$d/console.log" 2>&1
  local rc=$?
  echo "[$(( $(date +%s) - T0 )) s] $name ended rc=$rc"; echo "rc=$rc" >> "$d/console.log"
  tar czf "$TOP/$name.tgz" -C "$TOP" "$name" && rm -rf "$d"
}
{ nvidia-smi -L; python3 -V; nvcc --version | tail -1; } 2>&1 | tee "$TOP/box.txt"
for name in "$@"; do job "$name" & done
wait
echo "all jobs ended at $(( $(date +%s) - T0 )) s"; ls -la "$TOP"
