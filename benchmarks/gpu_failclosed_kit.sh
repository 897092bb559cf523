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
# What the two 0.5.23 routes import, small enough for one call beside the dependencies (the
# whole cp312 wheel's tree and FlashInfer 0.7.2's do not fit together): the patched cp312
# wheel's files without sglang/multimodal_gen, sglang/test, sglang/benchmark and the compiled
# Rust extensions (the layer path imports none of them), and FlashInfer 0.7.2's files outside data/
# with the sources its trtllm comm JIT compiles (data/include, cutlass, cccl, spdlog, the
# top-level data/csrc files).
S=.device/failclosed; t=$(mktemp -d)
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
  wheels/sglang-0.5.23/sglang-0.5.23+sm120.1-cp312-cp312-manylinux_2_34_x86_64.whl "$t/sg"
rm -rf "$t/sg/sglang/multimodal_gen" "$t/sg/sglang/test" "$t/sg/sglang/benchmark"
find "$t/sg" -name '*.so' -delete
tar -C "$t/sg" -cJf $S/sglang-0.5.23-cp312-layer.tar.xz .
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
  wheels/sglang-0.5.23/flashinfer_python-0.7.2-py3-none-any.whl "$t/fi"
find "$t/fi/flashinfer/data/csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
rm -rf "$t/fi/flashinfer/data/cubin" 2>/dev/null || true
tar -C "$t/fi" -cJf $S/flashinfer-0.7.2-layer.tar.xz .
# The stack's manifest: sglang-layer --manifest/--made-from checks the trees against it there
cp wheels/sglang-0.5.23/manifest.json $S/manifest.json
rm -rf "$t"; du -sh $S/*
