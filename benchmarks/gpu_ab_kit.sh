#!/usr/bin/env bash
# What the quick A/B with provenance (issue 21) carries to a leased GPU machine, under the
# git-ignored .device/ab/ (taken from gpu_kit.sh's kit, so that the carry stays small):
#   .device/ab/sglang-0.5.10/           our FlashInfer wheel + the stack's manifest.json
#   .device/ab/sglang-0.5.10/upstream/  the stock FlashInfer of the pin (the A/B baseline)
#   .device/ab/sglang-0.5.23/           FlashInfer 0.7.2 as published: its unpacked tree (the
#                                       wheel is larger than a call carries), the sha256 of
#                                       its RECORD, and the stack's manifest.json
#   .device/ab/deps/                    what FlashInfer 0.7.2 imports beyond the GPU image
# Usage: nox -s build -- --stack sglang-0.5.10; nox -s build -- --stack sglang-0.5.23;
#        bash benchmarks/gpu_kit.sh sglang-0.5.10 sglang-0.5.23; bash benchmarks/gpu_ab_kit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
K=.device/kit; A=.device/ab
rm -rf "${A:?}"; mkdir -p $A/sglang-0.5.10/upstream $A/sglang-0.5.23 $A/deps
cp $K/sglang-0.5.10/manifest.json $K/sglang-0.5.10/flashinfer_python-*.whl $A/sglang-0.5.10/
cp $K/sglang-0.5.10/upstream/flashinfer_python-*.whl $A/sglang-0.5.10/upstream/
cp $K/sglang-0.5.23/manifest.json $K/sglang-0.5.23/flashinfer_python-*.tree.tar.xz $A/sglang-0.5.23/
python3 - wheels/sglang-0.5.23/flashinfer_python-0.7.2-py3-none-any.whl \
  > $A/sglang-0.5.23/record.sha256 <<'PY'
import hashlib, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf:
    (record,) = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    print(hashlib.sha256(zf.read(record)).hexdigest())
PY
cp $K/whl312/common/apache_tvm_ffi-*.whl $K/whl312/common/cuda_tile-*.whl $A/deps/
du -sh $A $A/*
