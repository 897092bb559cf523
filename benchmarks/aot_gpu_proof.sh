#!/usr/bin/env bash
# One leased-GPU call: the AOT wheel of today's series on an H200 without nvcc, alone and
# beside a stock-like flashinfer-jit-cache (issue 18, items 1, 2 and 4).
# Run from the repository root (the toolkit's src/ is used from there).
# Inputs (carried, git-ignored), under $D (default .device/aot); all but aot/ are taken from
# the session kit $K (default .device/kit) when absent:
#   whl/        apache-tvm-ffi and cuda-tile for the GPU box's Python
#   flashinfer/ our flashinfer_python wheel (the default stack, today's series)
#   aot/        the AOT wheel (sm120fork-flashinfer-aot) built from the same tree
#   stock/      upstream's flashinfer_python 0.6.7.post3 wheel (the A/B's unpatched side)
# Steps ("no nvcc" = nvcc off PATH, CUDA_HOME unset, FLASHINFER_DISABLE_JIT=1, so any JIT
# attempt raises instead of compiling):
#   S  (background, nvcc) stock FlashInfer JIT-compiles its own trtllm_comm and norm: the
#      modules of a stock-like jit-cache (built from upstream's sources, no marker)
#   A0 no nvcc, the AOT wheel alone: one fused case, timed from launch to exit
#   then pip installs a flashinfer-jit-cache wheel made of S's modules and the AOT wheel
#      into one place: `pip list --path` must show both distributions
#   A1 no nvcc, AOT wheel + stock-like jit-cache: the same one case, timed
#   L  no nvcc: where our FlashInfer loads trtllm_comm and norm from (sm120fork.aot.check)
#   N  no nvcc: our FlashInfer's rmsnorm, which must load the stock-like jit-cache's norm
#   Q  no nvcc, AOT + stock-like jit-cache: `gpu test --quick --world-sizes 2` A/B, patched
#      (our FlashInfer: trtllm_comm from the AOT wheel) vs unpatched (stock FlashInfer:
#      trtllm_comm from the stock-like jit-cache, as a stock SGLang image would)
# Outputs: $OUT/timings.json, wheels.sha256, pip-list.json, lookup.json, norm.json, the
# logs, $OUT/reports.tgz (the gpu test report folders).
set -uo pipefail
export SM120FORK_SHARED_GPU_HOST=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=${D:-.device/aot}
OUT=${OUT:-/tmp/out}
QUICK_BUDGET=${QUICK_BUDGET:-200}
T=$(mktemp -d /tmp/aot18-XXXX)
SRC=$(pwd)/src
mkdir -p "$OUT" "$T/r"
# Only aot/ must be carried when the session kit (benchmarks/gpu_kit.sh) is there: the rest
# is taken from it. The FlashInfer wheel must be the one the AOT wheel was built for.
K=${K:-.device/kit}
if ! compgen -G "$D/flashinfer/*.whl" > /dev/null; then
  mkdir -p "$D/flashinfer"; cp "$K"/sglang-0.5.10/flashinfer_python-*.whl "$D/flashinfer/"; fi
if ! compgen -G "$D/stock/*.whl" > /dev/null; then
  mkdir -p "$D/stock"; cp "$K"/sglang-0.5.10/upstream/flashinfer_python-*.whl "$D/stock/"; fi
if ! compgen -G "$D/whl/*.whl" > /dev/null; then
  mkdir -p "$D/whl"
  cp "$K"/whl312/common/apache_tvm_ffi-*.whl "$K"/whl312/common/cuda_tile-*.whl "$D/whl/"
fi
python3 - "$D" > "$OUT/pins.txt" <<'EOF' || { cat "$OUT/pins.txt"; echo "the FlashInfer wheel is not the one the AOT wheel pins" >&2; exit 1; }
import hashlib, json, sys, zipfile
from pathlib import Path
d = Path(sys.argv[1])
(aot,), (fi,) = sorted(d.glob("aot/*.whl")), sorted(d.glob("flashinfer/*.whl"))
with zipfile.ZipFile(aot) as zf:
    pinned = json.loads(zf.read("sm120fork_flashinfer_aot/manifest.json"))["flashinfer"]["sha256"]
have = hashlib.sha256(fi.read_bytes()).hexdigest()
print("flashinfer wheel", fi.name, have, "| pinned by", aot.name, pinned)
raise SystemExit(have != pinned)
EOF
now() { date +%s.%N; }
inst() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --disable-pip-version-check "$@"; }
inst --target "$T/site" "$D"/whl/*.whl || exit 1
inst --target "$T/aotsite" "$D"/aot/*.whl || exit 1
inst --target "$T/fisite" "$D"/flashinfer/*.whl || exit 1
inst --target "$T/stockfi" "$D"/stock/*.whl || exit 1
(cd "$D" && sha256sum flashinfer/*.whl aot/*.whl stock/*.whl) > "$OUT/wheels.sha256"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)" \
  > "$OUT/python-torch.txt" 2>&1
NVCC=$(command -v nvcc)
NO_NVCC_PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -x -F "$(dirname "$NVCC")" | paste -sd:)
no_nvcc() { env -u CUDA_HOME -u CUDA_PATH PATH="$NO_NVCC_PATH" FLASHINFER_DISABLE_JIT=1 "$@"; }
ONE=(--quick --world-sizes 2 --api fusion_unified --pattern ar_rmsnorm --tokens 1
     --max-cases 1 --wheel-dir patched="$D"/flashinfer)

# S: the stock-like jit-cache's modules, compiled by stock FlashInfer's own JIT.
(
  S0=$(now)
  PYTHONPATH="$T/stockfi:$T/site" FLASHINFER_WORKSPACE_BASE="$T/stockjit" python3 -c "
import json, sys
from flashinfer.jit.comm import gen_trtllm_comm_module
from flashinfer.jit.norm import gen_norm_module
from flashinfer.jit.core import build_jit_specs
specs = [gen_trtllm_comm_module(), gen_norm_module()]
build_jit_specs(specs, verbose=False, skip_prebuilt=False)
print(json.dumps({s.name: str(s.jit_library_path) for s in specs}))
" > "$T/stock-build.out" 2> "$OUT/stock-build.log"
  echo "$? $S0 $(now)" > "$T/stock.done"
) &
S_PID=$!

A0=$(now)
no_nvcc env PYTHONPATH="$T/aotsite:$T/site:$SRC" python3 -m sm120fork.gpu test "${ONE[@]}" \
  --work-dir "$T/a0" --out "$T/r/first-aot" > "$OUT/first-aot.log" 2>&1
A0_RC=$?
A0_END=$(now)
A0_OBJ=$(find "$T/a0" -name '*.o' -o -name 'trtllm_comm.so' | wc -l)

wait "$S_PID"
read -r S_RC S0 S1 < "$T/stock.done"
# A flashinfer-jit-cache wheel of S's modules (layout and version as upstream's: no markers).
python3 - "$T/stock-build.out" "$T/stockwheel" > "$OUT/stock-jit-cache.log" 2>&1 <<'EOF'
import json, sys, zipfile
from pathlib import Path
built, out = json.loads(Path(sys.argv[1]).read_text().strip().splitlines()[-1]), Path(sys.argv[2])
out.mkdir(parents=True)
version = "0.6.7.post3+cu130"
info = f"flashinfer_jit_cache-{version}.dist-info"
files = {"flashinfer_jit_cache/__init__.py": (
    f'__version__ = "{version}"\nimport pathlib\n\ndef get_jit_cache_dir():\n'
    '    return str(pathlib.Path(__file__).parent / "jit_cache")\n').encode()}
for name, so in built.items():
    files[f"flashinfer_jit_cache/jit_cache/{name}/{name}.so"] = Path(so).read_bytes()
files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {version}\n".encode()
files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: stand-in\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"
files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]).encode()
wheel = out / f"flashinfer_jit_cache-{version}-py3-none-linux_x86_64.whl"
with zipfile.ZipFile(wheel, "w") as zf:
    for name, data in files.items():
        zf.writestr(name, data)
print(wheel, {n: len(d) for n, d in files.items()})
EOF
# Both into one place with pip (python3 there is itself a venv, so no venv of our own):
# two distributions of their own names, so pip keeps both.
E="$T/envsite"
inst --target "$E" "$T"/stockwheel/*.whl > "$OUT/pip-install.log" 2>&1
inst --target "$E" "$D"/aot/*.whl >> "$OUT/pip-install.log" 2>&1
python3 -m pip list --path "$E" --format json --disable-pip-version-check \
  2>> "$OUT/pip-install.log" > "$OUT/pip-list.json"

A1=$(now)
no_nvcc env PYTHONPATH="$E:$T/site:$SRC" python3 -m sm120fork.gpu test "${ONE[@]}" \
  --work-dir "$T/a1" --out "$T/r/first-aot-beside-stock" > "$OUT/first-aot-beside-stock.log" 2>&1
A1_RC=$?
A1_END=$(now)
A1_OBJ=$(find "$T/a1" -name '*.o' -o -name 'trtllm_comm.so' | wc -l)

# L: where our FlashInfer loads each module from, and why (the AOT check's own probe).
no_nvcc env PYTHONPATH="$T/fisite:$E:$T/site:$SRC" FLASHINFER_WORKSPACE_BASE="$T/lws" python3 -c "
import json, sys
from pathlib import Path
from sm120fork.aot import check, wheel
found = check.lookup(env={'FLASHINFER_WORKSPACE_BASE': '$T/lws'}, arch_list='9.0',
                     specs=[*check.DEFAULT_SPECS, 'flashinfer.jit.norm:gen_norm_module'])
made = wheel.read_wheel(next(Path('$D/aot').glob('*.whl')))
print(json.dumps({'found': found, 'problems': check.check_installed(made, found),
                  'describe': check.describe(found)}, indent=1))
" > "$OUT/lookup.json" 2> "$OUT/lookup.log"
L_RC=$?

# N: rmsnorm through our FlashInfer, JIT disabled: the stock-like jit-cache's norm.
no_nvcc env PYTHONPATH="$T/fisite:$E:$T/site" FLASHINFER_WORKSPACE_BASE="$T/nws" python3 -c "
import json, torch, flashinfer
x = torch.randn(7, 4096, device='cuda', dtype=torch.bfloat16)
w = torch.randn(4096, device='cuda', dtype=torch.bfloat16)
y = flashinfer.norm.rmsnorm(x, w, eps=1e-6)
ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
print(json.dumps({'flashinfer': flashinfer.__version__, 'max_rel_err': err, 'ok': err < 2e-2}))
" > "$OUT/norm.json" 2> "$OUT/norm.log"
N_RC=$?

no_nvcc env PYTHONPATH="$E:$T/site:$SRC" python3 -m sm120fork.gpu test --quick --world-sizes 2 \
  --wheel-dir patched="$D"/flashinfer --wheel-dir unpatched="$D"/stock --work-dir "$T/q" \
  --time-budget "$QUICK_BUDGET" --case-timeout 30 --out "$T/r/quick-ab" > "$OUT/quick-ab.log" 2>&1
Q_RC=$?
Q_OBJ=$(find "$T/q" -name '*.o' -o -name 'trtllm_comm.so' | wc -l)

python3 - "$A0" "$A0_END" "$A0_RC" "$A0_OBJ" "$A1" "$A1_END" "$A1_RC" "$A1_OBJ" "$S0" "$S1" \
  "$S_RC" "$L_RC" "$N_RC" "$Q_RC" "$Q_OBJ" > "$OUT/timings.json" <<'EOF'
import json, sys
a0, a0e, a0rc, a0o, a1, a1e, a1rc, a1o, s0, s1, src, lrc, nrc, qrc, qo = sys.argv[1:]
print(json.dumps({
    "first_fused_call_aot_alone": {"seconds": round(float(a0e) - float(a0), 1), "rc": int(a0rc),
                                   "compiled_objects_in_workspace": int(a0o),
                                   "how": "no nvcc; ran while the stock JIT compiled (CPU)"},
    "first_fused_call_aot_beside_stock_jit_cache": {
        "seconds": round(float(a1e) - float(a1), 1), "rc": int(a1rc),
        "compiled_objects_in_workspace": int(a1o), "how": "no nvcc; alone on the machine"},
    "stock_jit_cache_build": {"seconds": round(float(s1) - float(s0), 1), "rc": int(src),
                              "how": "stock FlashInfer's JIT, nvcc, trtllm_comm + norm"},
    "lookup_rc": int(lrc), "norm_rc": int(nrc),
    "quick_ab": {"rc": int(qrc), "compiled_objects_in_workspace": int(qo)},
    "measure": "wall seconds from launching `python -m sm120fork.gpu test` (one fused "
               "allreduce+residual+RMSNorm case, world size 2 sharing the GPU) to its exit",
}, indent=1))
EOF
cp "$T"/stock-build.out "$OUT/stock-build.json" 2>/dev/null
tar czf "$OUT/reports.tgz" -C "$T/r" . 2>/dev/null
cat "$OUT/timings.json" "$OUT/pip-list.json" "$OUT/norm.json"
python3 -c "import json; d = json.load(open('$OUT/lookup.json')); print('\n'.join(d['describe'])); print('problems:', d['problems'])"
tail -3 "$OUT/quick-ab.log"
ls -la "$OUT"
