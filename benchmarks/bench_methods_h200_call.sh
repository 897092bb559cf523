#!/usr/bin/env bash
# issue 22 on one H200 (SM90, ranks sharing the GPU: correctness only, no timing claims, no policy
# for use): every bench method at world size 2, each output checked against the fp32 reference
# (eager and CUDA-graph replay) before it is timed, for both stacks' FlashInfer at once:
#   sglang-0.5.10's patched 0.6.7.post3 (.device/bench/s510) and sglang-0.5.23's 0.7.2 as
#   published (.device/bench/s523, checked against its RECORD and rezipped here): pcie_ipc is 0.7.2's.
# Writes under $OUT: reports.tgz (<stack>/bench.{json,md,png}, policy.json, logs/), bench-<stack>.log,
# rc-<stack>, box.txt. Both runs go in parallel so their module builds (comm, norm, pcie_ipc, vllm)
# overlap; each stops starting points 120 s after its modules are built (module step <= 360 s).
set -uo pipefail
export SM120FORK_SHARED_GPU_HOST=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$PWD K=$PWD/.device/bench T=$(mktemp -d)
{ python3 -V; nvidia-smi -L; nvcc --version | tail -1; } > "$OUT/box.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$T/deps" "$K"/deps/*.whl \
  > "$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 1; }
# BENCH_STACKS: which stacks' halves run (a call carries one stack's kit at a time)
STACKS=${BENCH_STACKS:-sglang-0.5.10 sglang-0.5.23}
if [[ " $STACKS " == *" sglang-0.5.23 "* ]]; then
  mkdir -p "$T/fi072" "$T/s523"
  tar xJf "$K/s523/fi072.tree.tar.xz" -C "$T/fi072" || exit 1
  tree=$T/fi072; [ -d "$tree/flashinfer_python-0.7.2" ] && tree=$tree/flashinfer_python-0.7.2
  python3 "$R/benchmarks/gpu_stack2_check_tree.py" "$tree" "$(cat "$K/s523/record.sha256")" \
    "$T/s523/flashinfer_python-0.7.2-py3-none-any.whl" >> "$OUT/install.txt" 2>&1 \
    || { cat "$OUT/install.txt"; exit 1; }
  [ -f "$K/s523/manifest.json" ] && cp "$K/s523/manifest.json" "$T/s523/"
fi
export PYTHONPATH=$T/deps:$R/src
run() {  # stack, wheel dir
  timeout 510 python3 -m sm120fork.gpu bench --wheel-dir "patched=$2" --work-dir "$T/work-$1" \
    --out "$T/report/$1" --world-sizes 2 --tokens 1,16,128,512 --hidden 4096,7168 --quick \
    --compile-timeout 360 --time-budget 120 --startup-timeout 200 --case-timeout 120 \
    --not-run "ranks share one H200 (SM90): correctness only; timings and the policy are not for use" \
    --not-run "SM120/SM121 GPUs: none available (b12x needs SM12x)" \
    --not-run "world sizes 4 and 8 on separate GPUs; NCCL rows (NCCL refuses two ranks on one GPU)" \
    > "$OUT/bench-$1.log" 2>&1
  echo $? > "$OUT/rc-$1"
}
for stack in $STACKS; do
  case $stack in
    sglang-0.5.10) run sglang-0.5.10 "$K/s510" & ;;
    sglang-0.5.23) run sglang-0.5.23 "$T/s523" & ;;
    *) echo "unknown stack $stack" >&2; exit 2 ;;
  esac
done
wait
# no machine paths in what comes back: the scratch folder, the checkout and the interpreter by role
PY=$(python3 -c 'import sys; print(sys.executable)')
grep -rlF -e "$T" -e "$R/" -e "$PY" "$T/report" "$OUT"/bench-*.log "$OUT/install.txt" 2>/dev/null \
  | while read -r f; do sed -i -e "s#$PY#<gpu-python>#g" -e "s#$T#<tmp>#g" -e "s#$R/#<checkout>/#g" "$f"; done
tar czf "$OUT/reports.tgz" -C "$T/report" .
tail -n 15 "$OUT"/bench-*.log; cat "$OUT"/rc-*
