#!/usr/bin/env bash
# doctor on the H200 (issue 20): a fresh --record of this box, three ways a user would run it:
#   1. the toolkit's doctor from src/ on the bare box                     -> h200-bare.{txt,json}
#   2. the same beside the default stack's patched FlashInfer + SGLang,
#      installed --no-deps from .device/doctor/site (benchmarks/doctor_h200_kit.sh)
#                                                                          -> h200.{txt,json}, h200.facts.json
#      then that record judged offline (--facts), which must print the same -> h200.refacts.txt
#   3. the plugin wheel alone (its own sm120fork-doctor console script, no toolkit on the path)
#                                                                          -> h200-plugin-wheel.{txt,json}
# plus `python3 -m sm120fork doctor --json` (the toolkit CLI's verb) -> h200-cli-verb.json.
# Each doctor runs under its own timeout; the whole call takes about a minute.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$PWD D=$PWD/.device/doctor S=$(mktemp -d) P=$(mktemp -d) W=$(mktemp -d)
{ python3 -V; nvidia-smi -L; } > "$OUT/box.txt" 2>&1
doc() {  # name, PYTHONPATH, command...
  local name=$1 path=$2; shift 2
  local t0; t0=$(date +%s)
  (cd "$W" && PYTHONPATH=$path timeout 240 "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err")
  echo "rc=$? seconds=$(( $(date +%s) - t0 ))" >> "$OUT/$name.txt"
}
doc h200-bare "$R/src" python3 -m sm120fork.doctor --record "$OUT/h200-bare.json"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$S" "$D"/site/*.whl \
  > "$OUT/install.txt" 2>&1; echo "site install rc=$?" >> "$OUT/install.txt"
doc h200 "$S:$R/src" python3 -m sm120fork.doctor --record "$OUT/h200.facts.json"
(cd "$W" && PYTHONPATH=$S:$R/src python3 -m sm120fork.doctor --facts "$OUT/h200.facts.json" \
  --json > "$OUT/h200.json" 2>> "$OUT/h200.err")
doc h200.refacts "$S:$R/src" python3 -m sm120fork.doctor --facts "$OUT/h200.facts.json"
(cd "$W" && PYTHONPATH=$S:$R/src timeout 240 python3 -m sm120fork doctor --json \
  > "$OUT/h200-cli-verb.json" 2> "$OUT/h200-cli-verb.err"; echo "cli verb rc=$?" >> "$OUT/install.txt")
if compgen -G "$D/plugin/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$P" "$D"/plugin/*.whl \
    >> "$OUT/install.txt" 2>&1; echo "plugin install rc=$?" >> "$OUT/install.txt"
  doc h200-plugin-wheel "$P" "$P/bin/sm120fork-doctor" --record "$OUT/h200-plugin-wheel.json"
fi
grep -H "rc=" "$OUT"/*.txt; cat "$OUT/h200.txt"
