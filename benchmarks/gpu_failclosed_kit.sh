#!/usr/bin/env bash
# What benchmarks/gpu_failclosed.sh s523-plugin carries beyond .device/kit: upstream's bytes of
# every file stack sglang-0.5.23's series changes (from the fork tree's `upstream` tag) and the
# RECORD of the stock cp312 wheel they are checked against there, under .device/failclosed/.
# Usage (after `nox -s build -- --stack sglang-0.5.23`): bash benchmarks/gpu_failclosed_kit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
T=.forks/trees/sglang-0.5.23/sglang; O=.device/failclosed/stock-overlay
W=$(ls .forks/cache/wheels/sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl)
rm -rf "$O"; mkdir -p "$O/files"
git -C "$T" diff --name-only upstream HEAD -- python/sglang | while read -r f; do
  rel=${f#python/}; mkdir -p "$O/files/$(dirname "$rel")"
  git -C "$T" show "upstream:$f" > "$O/files/$rel"; echo "$rel"
done
python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = [m for m in z.namelist() if m.endswith('.dist-info/RECORD')][0]; sys.stdout.write(z.read(n).decode())" "$W" > "$O/RECORD.stock"
du -sh .device/failclosed
