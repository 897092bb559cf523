#!/usr/bin/env bash
# What the H200 bench-methods call (issue 22) carries, packed under the git-ignored .device/bench/:
#   s510/  the default stack's patched FlashInfer wheel + manifest.json (wheels/sglang-0.5.10/, `nox -s build`)
#   s523/  flashinfer-python 0.7.2 as published (stack sglang-0.5.23's pin, sha256-checked), as its
#          unpacked tree (xz) + the RECORD's sha256 (checked and rezipped there), + manifest.json if built
#   deps/  the two cp312 wheels FlashInfer imports that the GPU image lacks
# Usage: bash benchmarks/bench_methods_kit.sh   (then carry .device/bench; about 30 MB). Reuses
# benchmarks/gpu_kit.sh's tree of 0.7.2 when .device/kit/sglang-0.5.23 holds it (its xz takes minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
K=.device/bench
rm -rf "$K"; mkdir -p "$K/s510" "$K/s523" "$K/deps"
[ -f wheels/sglang-0.5.10/manifest.json ] || { echo "no build of sglang-0.5.10: nox -s build" >&2; exit 2; }
cp wheels/sglang-0.5.10/flashinfer_python-*.whl wheels/sglang-0.5.10/manifest.json "$K/s510/"
W=flashinfer_python-0.7.2-py3-none-any.whl
SHA=$(python3 -c "import tomllib; d=tomllib.load(open('forks/sglang-0.5.23.toml','rb')); print(next(w['sha256'] for w in d['projects']['flashinfer']['wheels'] if w['filename']=='$W'))")
G=.device/kit/sglang-0.5.23/${W%.whl}   # benchmarks/gpu_kit.sh sglang-0.5.23 packed it already
[ -f wheels/sglang-0.5.23/manifest.json ] && cp wheels/sglang-0.5.23/manifest.json "$K/s523/"
if [ -f "$G.tree.tar.xz" ] && [ -f "$G.record.sha256" ]; then
  cp "$G.tree.tar.xz" "$K/s523/fi072.tree.tar.xz"; cp "$G.record.sha256" "$K/s523/record.sha256"
else
  T=$(mktemp -d)
  if [ -f "wheels/sglang-0.5.23/$W" ]; then cp "wheels/sglang-0.5.23/$W" "$T/"
  else python3 -m pip download -q --no-deps --only-binary=:all: -d "$T" flashinfer-python==0.7.2; fi
  echo "$SHA  $T/$W" | sha256sum -c -
  python3 -m pip install -q --target "$T/tool" wheel >/dev/null
  PYTHONPATH="$T/tool" python3 -m wheel unpack -d "$T/tree" "$T/$W" >/dev/null
  tree=$(echo "$T"/tree/*)
  sha256sum "$tree"/*.dist-info/RECORD | cut -d' ' -f1 > "$K/s523/record.sha256"
  tar -C "$tree" -cf - . | xz -3 -T2 > "$K/s523/fi072.tree.tar.xz"   # a few minutes on 2 cores
  rm -rf "$T"
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$K/deps" apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0
du -sh "$K"/*
