#!/usr/bin/env bash
# Turn what the job fi074 (benchmarks/gpu_fi074_run.sh, via benchmarks/gpu_session.sh) brought
# back into the committed reports: reports/gpu/f5-cluster-0.7.4/ and
# reports/gpu/flashinfer-0.7.4-h200/ (test-ab.{json,md}, rank logs, the run's console under
# console/), the device's checkout and $OUT paths replaced by their roles. upstream_pr finds
# the two test-ab.json by their stack and made_from (reports/gpu/*/test-ab.json).
# Usage: bash benchmarks/gpu_fi074_commit.sh <returned fi074.tgz>
set -euo pipefail
cd "$(dirname "$0")/.."
TGZ=${1:?the fi074.tgz the device call returned}
t=$(mktemp -d); tar xzf "$TGZ" -C "$t"; S=$t/fi074
[ -d "$S" ] || { echo "no fi074/ in $TGZ" >&2; exit 2; }
CO=$(sed -n 's/^checkout //p' "$S/box.txt"); OUTP=$(sed -n 's/^out //p' "$S/box.txt")
PY=$(sed -n 's/^python //p' "$S/box.txt")  # the GPU machine's interpreter (newer boxes record it)
[ -n "$CO" ] && [ -n "$OUTP" ] || { echo "box.txt names no checkout/out" >&2; exit 2; }
for name in f5-cluster-0.7.4 flashinfer-0.7.4-h200; do
  [ -f "$S/$name/test-ab.json" ] || { echo "warning: $name has no report" >&2; continue; }
  rm -rf "reports/gpu/$name"; mkdir -p "reports/gpu/$name/console"
  cp -r "$S/$name"/. "reports/gpu/$name/"
done
C=reports/gpu/f5-cluster-0.7.4/console; mkdir -p $C reports/gpu/flashinfer-0.7.4-h200/console
for f in box.txt carry.log summary.txt shim-lines.txt f5-cluster.log console.log; do
  [ -f "$S/$f" ] && cp "$S/$f" $C/
done
[ -f "$S/ab.log" ] && cp "$S/ab.log" reports/gpu/flashinfer-0.7.4-h200/console/
# no machine paths in committed reports: the device's checkout, output folder and interpreter by role
grep -rlF -e "$CO" -e "$OUTP" -e "${PY:-$CO}" reports/gpu/f5-cluster-0.7.4 reports/gpu/flashinfer-0.7.4-h200 2>/dev/null \
  | while read -r f; do
      [ -n "$PY" ] && sed -i -e "s#$PY#<gpu-python>#g" "$f"
      sed -i -e "s#$OUTP#<out>#g" -e "s#$CO/##g" -e "s#$CO#.#g" "$f"
    done
rm -rf "$t"
cat reports/gpu/f5-cluster-0.7.4/console/summary.txt
