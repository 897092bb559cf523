#!/usr/bin/env bash
# One leased-GPU call: SGLang's fused-norm layer path for both stacks, ranks sharing the
# H200 over a gloo TP group.  Everything it imports is carried under .device/sglang.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SM120FORK_SHARED_GPU_HOST=1
D=.device/sglang; R=$D/run; mkdir -p $R/s510 $R/s523 $R/fi072
T0=$(date +%s)
tar xJf $D/site-common.tar.xz -C $R & tar xJf $D/site-0.5.10.tar.xz -C $R & tar xJf $D/site-0.5.23.tar.xz -C $R &
tar xJf $D/sglang-0.5.10.tar.xz -C $R/s510 & tar xJf $D/sglang-0.5.23-g1g5.tar.xz -C $R/s523 &
tar xJf $D/flashinfer-0.7.2-subset.tar.xz -C $R/fi072 &
python3 -m pip install -q --no-index --no-deps --no-compile --target $R/fi067 $D/whl/flashinfer_python-*.whl &
wait; echo "unpacked in $(( $(date +%s) - T0 )) s"
nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; nvcc --version | tail -2
J510=$PWD/$R/jit510; J523=$PWD/$R/jit523
build() { FLASHINFER_WORKSPACE_BASE=$1 PYTHONPATH=$2:$R/site_common python3 -c "import time; t=time.time()
from flashinfer.comm.trtllm_ar import get_trtllm_comm_module as g; g(); print('comm module ready in %.0f s' % (time.time()-t))"; }
build $J510 $R/fi067 > $OUT/jit-0.5.10.log 2>&1 &
build $J523 $R/fi072 > $OUT/jit-0.5.23.log 2>&1 &
wait; tail -3 $OUT/jit-*.log; echo "jit done at $(( $(date +%s) - T0 )) s"
export PYTHONPATH=$D/src
( FLASHINFER_WORKSPACE_BASE=$J510 python3 -m sm120fork.gpu sglang-layer --sglang-path $R/s510/python \
   --site $R/fi067 --site $R/site510 --site $R/site_common --timeout 40 --first-timeout 200 --start-timeout 150 \
   --title "SGLang 0.5.10.post1 + S1-S4, FlashInfer 0.6.7.post3 + F1-F6: fused-norm layer path on one H200 (2 ranks sharing it)" \
   --note "capability query stubbed to 12.0 for callers in sglang.* only; FlashInfer builds and runs for the real SM90" \
   --note "TP group: a gloo group over the 2 rank processes; sgl_kernel replaced by an import stub (built for another torch), so the unfused norm is SGLang's forward_native" \
   --out $OUT/sglang-0.5.10 > $OUT/layer-0.5.10.log 2>&1 ) &
( FLASHINFER_WORKSPACE_BASE=$J523 python3 -m sm120fork.gpu sglang-layer --sglang-path $R/s523/python \
   --site $R/fi072 --site $R/site523 --site $R/site_common --timeout 40 --first-timeout 200 --start-timeout 150 \
   --case fused --case all-ranks-create-fails --case one-rank-fails-midway \
   --title "SGLang 0.5.23 + G1-G5, FlashInfer 0.7.2 as published: fused-norm layer path on one H200 (2 ranks sharing it)" \
   --note "capability query stubbed to 12.0 for callers in sglang.* only; FlashInfer builds and runs for the real SM90" \
   --note "TP group: a gloo group over the 2 rank processes; sgl_kernel replaced by an import stub, so the unfused norm is SGLang's forward_native" \
   --out $OUT/sglang-0.5.23 > $OUT/layer-0.5.23.log 2>&1 ) &
wait; echo "all done at $(( $(date +%s) - T0 )) s"; tail -12 $OUT/layer-*.log
