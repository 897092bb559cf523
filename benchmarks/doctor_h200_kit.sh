#!/usr/bin/env bash
# What the doctor's H200 record (issue 20) carries, packed under the git-ignored .device/doctor/:
#   site/    the default stack's patched FlashInfer + SGLang wheels (wheels/sglang-0.5.10/, from
#            `nox -s build`) and the two cp312 wheels FlashInfer imports that the GPU image lacks
#   plugin/  stack sglang-0.5.23's plugin wheel (wheels/sglang-0.5.23/plugin/), if that stack is built
# Usage: bash benchmarks/doctor_h200_kit.sh   (then carry .device/doctor; about 15 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
D=.device/doctor
rm -rf "$D"; mkdir -p "$D/site" "$D/plugin"
ls wheels/sglang-0.5.10/flashinfer_python-*.whl >/dev/null || {
  echo "no build of sglang-0.5.10: nox -s build" >&2; exit 2; }
cp wheels/sglang-0.5.10/flashinfer_python-*.whl wheels/sglang-0.5.10/sglang-*.whl "$D/site/"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$D/site" apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0
if compgen -G "wheels/sglang-0.5.23/plugin/*.whl" >/dev/null; then
  cp wheels/sglang-0.5.23/plugin/*.whl "$D/plugin/"
else
  echo "no plugin wheel of sglang-0.5.23 (nox -s build -- --stack sglang-0.5.23): that run is skipped" >&2
fi
du -sh "$D"/*
