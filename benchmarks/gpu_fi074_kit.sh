#!/usr/bin/env bash
# What stack flashinfer-0.7.4's GPU evidence (issue 19 item 6, issue 21 item 1) carries to a
# leased GPU machine, under the git-ignored .device/fi074/ (about 20 MiB; a call carries 64):
#   upstream/  FlashInfer 0.7.4 as published (the A/B baseline, upstream's code): the files
#              the comm module's JIT and the harness read, xz-compressed, with the list of
#              carried paths and the sha256 of the wheel's RECORD (benchmarks/gpu_wheel_subset.py)
#   patched/   the fork's build (wheels/flashinfer-0.7.4/): the same paths of its own RECORD;
#              only the files whose bytes differ from upstream's travel (F5's header, 0001's
#              env.py, the version stamp, the dist-info), the rest is upstream's tree, every
#              file checked against this wheel's RECORD there; and the stack's manifest.json
#   deps/      what FlashInfer 0.7.4 imports beyond the GPU image (apache-tvm-ffi, cuda-tile)
#   shim/      benchmarks/cluster_answer_shim.{c,map}: the forced cluster answer (built there)
# Usage (after `nox -s build -- --stack flashinfer-0.7.4`): bash benchmarks/gpu_fi074_kit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
F=.device/fi074; W=wheels/flashinfer-0.7.4
[ -f $W/manifest.json ] || { echo "no build of flashinfer-0.7.4: nox -s build -- --stack flashinfer-0.7.4" >&2; exit 2; }
PATCHED=$(ls $W/flashinfer_python-0.7.4+*-py3-none-any.whl)
rm -rf "${F:?}"; mkdir -p $F/upstream $F/patched $F/deps $F/shim
UP=.device/kit/flashinfer-0.7.4/upstream  # where benchmarks/gpu_kit.sh puts it, if it ran
if ! ls $UP/flashinfer_python-0.7.4-py3-none-any.whl > /dev/null 2>&1; then
  mkdir -p $UP
  python3 -m pip download -q --no-deps --only-binary=:all: -d $UP flashinfer-python==0.7.4
fi
UPW=$UP/flashinfer_python-0.7.4-py3-none-any.whl
python3 benchmarks/gpu_wheel_subset.py pack "$UPW" $F/upstream
python3 benchmarks/gpu_wheel_subset.py pack "$PATCHED" $F/patched --base "$UPW"
cp $W/manifest.json $F/patched/
DEPS=.device/kit/whl312/common
if ls $DEPS/apache_tvm_ffi-*.whl $DEPS/cuda_tile-*.whl > /dev/null 2>&1; then
  cp $DEPS/apache_tvm_ffi-*.whl $DEPS/cuda_tile-*.whl $F/deps/
else
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d $F/deps apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0
fi
cp benchmarks/cluster_answer_shim.c benchmarks/cluster_answer_shim.map $F/shim/
du -sh $F $F/*
