#!/usr/bin/env bash
# doctor on the H200 (issue 12): the toolkit's doctor on the bare box, then the doctor of the
# plugin wheel (console script) beside stock sglang 0.5.23 + the plugin, both installed --no-deps.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=.device/plugin
{ python3 -V; nvidia-smi -L; } > $OUT/box.txt 2>&1
T0=$(date +%s)
PYTHONPATH=$PWD/src timeout 60 python3 -m sm120fork.doctor > $OUT/doctor-toolkit.txt 2>$OUT/doctor-toolkit.err
echo "rc=$? seconds=$(( $(date +%s) - T0 ))" >> $OUT/doctor-toolkit.txt
PYTHONPATH=$PWD/src timeout 60 python3 -m sm120fork.doctor --json > $OUT/doctor-toolkit.json 2>>$OUT/doctor-toolkit.err
echo "json rc=$?" >> $OUT/doctor-toolkit.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $D/*.whl > $OUT/install.txt 2>&1
T0=$(date +%s)
PYTHONPATH=/tmp/site timeout 70 /tmp/site/bin/sm120fork-doctor --decide-timeout 40 > $OUT/doctor-plugin-wheel.txt 2>$OUT/doctor-plugin-wheel.err
echo "rc=$? seconds=$(( $(date +%s) - T0 ))" >> $OUT/doctor-plugin-wheel.txt
cat $OUT/*.txt
