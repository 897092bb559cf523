#!/usr/bin/env bash
# One leased-GPU call per install route (issue 19 item 5): SGLang's own fused-norm layer path,
# two rank processes sharing the H200 over a gloo TP group, all six cases
# (fused, all-ranks-create-fails, one-rank-create-fails, one-rank-fails-midway,
# one-rank-fails-late, fused-call-raises) and the two of a fused call raising on one rank
# only (rank-0-fused-call-raises, one-rank-fused-call-raises: rank 1), with the agreement
# timeout set to 5 s and the gloo groups' to 60 s, so a bound that came from the group's
# timeout would show. Multicast off, FlashInfer backend "trtllm" only.
#   bash benchmarks/gpu_failclosed.sh s510          default stack: patched sglang 0.5.10 + FlashInfer 0.6.7.post3 wheels
#   bash benchmarks/gpu_failclosed.sh s523          stack sglang-0.5.23: the patched cp312 wheel (G1-G6), FlashInfer 0.7.2
#   bash benchmarks/gpu_failclosed.sh s523-plugin   stock sglang 0.5.23 + the generated plugin, load_plugins() in each rank
# Carried (git-ignored, made here by `bash benchmarks/gpu_kit.sh sglang-0.5.10 sglang-0.5.23`
# and `bash benchmarks/gpu_failclosed_kit.sh`): .device/kit/whl312/common and
#   s510:         .device/kit/whl312/s510, .device/kit/sglang-0.5.10 (the built wheels)
#   s523(-plugin): .device/kit/whl312/s523, .device/failclosed (the cp312 wheel's files and
#                 FlashInfer 0.7.2's as the layer path imports them, upstream's bytes of the
#                 series' files), .device/kit/sglang-0.5.23/plugin
# The comm module's JIT cache stays under .device/failclosed/jit-* (kept on a warm machine, so the
# second 0.7.2 route reuses it). Each call stops its cases in time to end within 9 minutes.
set -uo pipefail
ROUTE=${1:?route: s510, s523 or s523-plugin}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SM120FORK_SHARED_GPU_HOST=1
K=.device/kit; F=.device/failclosed; R=$PWD/$F/run-$ROUTE; T0=$(date +%s)
rm -rf "$R"; mkdir -p "$R/site_common" "$R/site_deps" "$R/sg" "$R/fi" "$R/plugin"
OUTD=$OUT/$ROUTE; mkdir -p "$OUTD"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --target "$@"; }
pipi "$R/site_common" $K/whl312/common/*.whl
case $ROUTE in
  s510)
    pipi "$R/site_deps" $K/whl312/s510/*.whl
    pipi "$R/sg" $K/sglang-0.5.10/sglang-*.whl
    pipi "$R/fi" $K/sglang-0.5.10/flashinfer_python-*.whl
    SG=$R/sg; FI=$R/fi; JIT=$PWD/$F/jit-067; EXTRA=(--layout communicator)
    # provenance (issue 21): the stack's manifest and the two wheel files installed above
    EXTRA+=(--manifest $K/sglang-0.5.10/manifest.json)
    for w in $K/sglang-0.5.10/sglang-*.whl $K/sglang-0.5.10/flashinfer_python-*.whl; do
      EXTRA+=(--made-from "$(basename "$w")=$w"); done ;;
  s523|s523-plugin)
    pipi "$R/site_deps" $K/whl312/s523/*.whl
    # FlashInfer 0.7.2 is the same tree on both routes: unpacked afresh at one place (tar keeps
    # its files' times), so the second route on a warm machine can reuse the first one's comm
    # module build (JIT cache .device/jit-072, outside the carried .device/failclosed, which a
    # call replaces). Run these two routes one after the other, not side by side
    # (FAILCLOSED_SHARED_JIT=0 gives each route its own folders again).
    SG=$R/sg; FI=$R/fi; JIT=$PWD/$F/jit-072-$ROUTE
    if [ "${FAILCLOSED_SHARED_JIT:-1}" = 1 ]; then FI=$PWD/.device/fi-072; JIT=$PWD/.device/jit-072; rm -rf "$FI"; mkdir -p "$FI"; fi
    tar xJf $F/sglang-0.5.23-cp312-layer.tar.xz -C "$SG" & tar xJf $F/flashinfer-0.7.2-layer.tar.xz -C "$FI" & wait
    EXTRA=(--layout layer_boundary)
    if [ "$ROUTE" = s523 ]; then  # provenance (issue 21): both trees against their wheels' RECORDs
      EXTRA+=(--manifest $F/manifest.json
              --made-from "sglang-0.5.23+sm120.1-cp312-cp312-manylinux_2_34_x86_64.whl=$SG"
              --made-from "flashinfer_python-0.7.2-py3-none-any.whl=$FI")
    fi
    if [ "$ROUTE" = s523-plugin ]; then
      # stock: the wheel's tree with every file the series changes put back to upstream's bytes,
      # each checked against the stock wheel's RECORD; then the plugin wheel beside it
      python3 - "$SG" $F/stock-overlay <<'PY' || exit 1
import base64, hashlib, shutil, sys
from pathlib import Path
tree, overlay = Path(sys.argv[1]), Path(sys.argv[2])
record = {l.split(",")[0]: l.split(",")[1] for l in (overlay / "RECORD.stock").read_text().splitlines() if l}
for f in sorted(p for p in (overlay / "files").rglob("*") if p.is_file()):
    rel = f.relative_to(overlay / "files").as_posix()
    digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(f.read_bytes()).digest()).rstrip(b"=").decode()
    assert record[rel] == digest, (rel, digest, record.get(rel))
    shutil.copyfile(f, tree / rel); print("stock", rel, digest)
PY
      python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" $K/sglang-0.5.23/plugin/*.whl "$R/plugin"
      EXTRA+=(--site "$R/plugin" --load-plugins)
    fi ;;
  *) echo "unknown route $ROUTE" >&2; exit 2 ;;
esac
echo "unpacked in $(( $(date +%s) - T0 )) s: sglang $SG, flashinfer $FI" | tee "$OUTD/setup.log"
nvidia-smi -L | tee -a "$OUTD/setup.log"
FLASHINFER_WORKSPACE_BASE=$JIT PYTHONPATH=$FI:$R/site_common python3 -c "import time; t=time.time()
from flashinfer.comm.trtllm_ar import get_trtllm_comm_module as g; g(); print('comm module ready in %.0f s' % (time.time()-t))" > "$OUTD/jit.log" 2>&1
echo "jit rc $? at $(( $(date +%s) - T0 )) s"; tail -2 "$OUTD/jit.log"
# FAILCLOSED_END: seconds after the start by which the cases stop (520 beside other jobs; a
# route alone in a call can take more)
LEFT=$(( ${FAILCLOSED_END:-520} - ($(date +%s) - T0) )); echo "layer cases get ${LEFT} s"
# FAILCLOSED_CASES: only these cases (space-separated), e.g. the ones an earlier call of the
# same route lost to its time limit; default all eight
CASES=()
for c in ${FAILCLOSED_CASES:-fused all-ranks-create-fails one-rank-create-fails one-rank-fails-midway \
    one-rank-fails-late fused-call-raises rank-0-fused-call-raises one-rank-fused-call-raises}; do
  CASES+=(--case "$c"); done
PYTHONPATH=$PWD/src FLASHINFER_WORKSPACE_BASE=$JIT timeout -s TERM $LEFT python3 -m sm120fork.gpu sglang-layer \
  --sglang-path "$SG" --site "$FI" --site "$R/site_deps" --site "$R/site_common" "${EXTRA[@]}" \
  --timeout 45 --first-timeout 120 --start-timeout 150 \
  "${CASES[@]}" --agreement-timeout 5 --group-timeout 60 \
  --title "Issue 19 fault matrix, route $ROUTE: SGLang's fused-norm layer path on one H200 (2 ranks sharing it)" \
  --note "route $ROUTE; capability query stubbed to 12.0 for callers in sglang.* only; FlashInfer builds and runs for the real SM90" \
  --note "TP group: gloo over the 2 rank processes (device group a second gloo group); sgl_kernel an import stub, so the unfused norm is SGLang's forward_native" \
  --out "$OUTD/layer" > "$OUTD/layer.log" 2>&1
echo "layer rc $? at $(( $(date +%s) - T0 )) s"; tail -8 "$OUTD/layer.log"
# at most 8 files come back, 2 folders down: one archive plus the report
cp "$OUTD/layer/report.md" "$OUT/report-$ROUTE.md" 2>/dev/null
tar czf "$OUT/results-$ROUTE.tgz" -C "$OUT" "$ROUTE" && rm -rf "$OUTD"; ls -la "$OUT"
