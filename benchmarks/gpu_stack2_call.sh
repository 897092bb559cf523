#!/usr/bin/env bash
# stack2: flashinfer-python 0.7.2 as published, through gpu test --quick (ws 2, ranks
# sharing the GPU), on the unified trtllm path SGLang 0.5.23 uses. Multicast stays off.
set -uo pipefail
export SM120FORK_SHARED_GPU_HOST=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$H"/whl/*.whl || exit 1
mkdir -p /tmp/fi && tar xJf "$H/fi72.tar.xz" -C /tmp/fi || exit 1
python3 "$H/check_tree.py" /tmp/fi 5df50e9e2289e41c3d26d5ecd0ec9e188ff8a1d0c675df8860c69cc779e7efec \
  /tmp/wheel/flashinfer_python-0.7.2-py3-none-any.whl 2>&1 | tee "$OUT/carry.log" || exit 1
export PYTHONPATH=/tmp/site:$H/src
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -m sm120fork.gpu test --quick --world-sizes 2 --api fusion_unified \
  --wheel-dir stack2=/tmp/wheel --primary stack2 --case-timeout 60 --time-budget 230 \
  --out /tmp/report/stack2-flashinfer-0.7.2 \
  --not-run "A/B against another FlashInfer: 0.7.2 needs no patch, so only the published wheel is run" \
  --not-run "SM120/SM121 GPUs: none available here (SM90, no multicast in use: the PCIe SM12x situation for the workspace)" \
  --not-run "FP4 patterns: need sm_100 or newer" 2>&1 | tee "$OUT/test.log"
rc=$?
tar czf "$OUT/report.tgz" -C /tmp/report stack2-flashinfer-0.7.2
exit $rc
