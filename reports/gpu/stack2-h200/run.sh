#!/usr/bin/env bash
# One leased-GPU call for issue 10 (stack sglang-0.5.23), ranks sharing the H200, multicast off:
#  1. the patched cp312 sglang wheel: rebuilt byte for byte from its carried tree (wheel pack,
#     SOURCE_DATE_EPOCH of the build), sha256 checked, pip-installed, imported on Python 3.12;
#  2. stack 2's FlashInfer 0.7.2 as published (tree checked against its RECORD) through
#     `gpu test --quick --world-sizes 2` on the unified trtllm path SGLang 0.5.23 uses;
#  3. SGLang's fused-norm layer path from the installed cp312 wheel, reusing step 2's JIT cache.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SM120FORK_SHARED_GPU_HOST=1
D=.device/stack2b; R=$PWD/.device/stack2b/run; mkdir -p $R/sgtree $R/fi $R/wheel $R/sgwhl; T0=$(date +%s)
WANT=d3ad8ec516e83a6070cd61f86de37e0398cf093e323fdc209968b0ac1a6eafc4  # manifest.json, cp312 x86_64
EPOCH=1796083200
tar xJf $D/sglang-cp312-tree.tar.xz -C $R/sgtree & tar xJf $D/fi72.tar.xz -C $R/fi &
tar xJf $D/site-common.tar.xz -C $R & tar xJf $D/site-0.5.23.tar.xz -C $R & wait
echo "unpacked in $(( $(date +%s) - T0 )) s"
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; nvidia-smi -L
python3 $D/check_tree.py $R/sgtree/sglang-0.5.23+sm120.1 08c7a81448b8e8e13250d09c037e3f11d383f5fa5b346a7a216f10f9457a7a18 \
  $R/rezip/sglang.whl 2>&1 | tee $OUT/cp312-carry.log || exit 1
python3 -m pip install -q --no-index --no-deps --target $R/wheeltool $D/wheel-0.48.0-py3-none-any.whl $D/packaging-*.whl
( SOURCE_DATE_EPOCH=$EPOCH PYTHONPATH=$R/wheeltool python3 -m wheel pack --dest-dir $R/sgwhl $R/sgtree/sglang-0.5.23+sm120.1 ) > $OUT/wheel-pack.log 2>&1
W=$(ls $R/sgwhl/*.whl); GOT=$(sha256sum "$W" | cut -d' ' -f1)
echo "$(basename "$W") sha256 $GOT (manifest: $WANT)" | tee $OUT/cp312-wheel.txt
if [ "$GOT" = "$WANT" ]; then echo "identical to the built wheel" | tee -a $OUT/cp312-wheel.txt
else echo "digest differs from the built wheel (zlib $(python3 -c 'import zlib; print(zlib.ZLIB_RUNTIME_VERSION)') here; the build used 1.2.13); the RECORD check above stands" | tee -a $OUT/cp312-wheel.txt; fi
python3 -m pip install --no-index --no-deps --no-compile --target $R/sg312 "$W" > $OUT/cp312-install.log 2>&1; echo "pip install rc $?" | tee -a $OUT/cp312-install.log
python3 $D/check_tree.py $R/fi 5df50e9e2289e41c3d26d5ecd0ec9e188ff8a1d0c675df8860c69cc779e7efec \
  $R/wheel/flashinfer_python-0.7.2-py3-none-any.whl 2>&1 | tee $OUT/fi-carry.log || exit 1
G=$R/gpuwork; export PYTHONPATH=$PWD/src:$R/site_common  # tvm_ffi, cuda_tile for FlashInfer 0.7.2
python3 -m sm120fork.gpu test --quick --world-sizes 2 --api fusion_unified --work-dir $G \
  --wheel-dir stack2=$R/wheel --primary stack2 --case-timeout 60 --time-budget 420 \
  --out $OUT/stack2-flashinfer-0.7.2 \
  --not-run "A/B against another FlashInfer: 0.7.2 needs no patch, so only the published wheel is run" \
  --not-run "SM120/SM121 GPUs: none available here (SM90, no multicast in use: the PCIe SM12x situation for the workspace)" \
  --not-run "FP4 patterns: need sm_100 or newer" > $OUT/gpu-test.log 2>&1
echo "gpu test rc $? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/gpu-test.log
PYTHONPATH=$R/sg312:$G/stack2/site:$R/site523:$R/site_common:$PWD/src FLASHINFER_WORKSPACE_BASE=$G/stack2/jit \
  python3 $D/imports.py $R/sg312 > $OUT/cp312-imports.json 2> $OUT/cp312-imports.err; echo "imports rc $?"; cat $OUT/cp312-imports.json | head -40
LEFT=$(( 535 - ($(date +%s) - T0) )); echo "layer cases get ${LEFT} s"
FLASHINFER_WORKSPACE_BASE=$G/stack2/jit timeout -s TERM $LEFT python3 -m sm120fork.gpu sglang-layer --sglang-path $R/sg312 \
   --site $G/stack2/site --site $R/site523 --site $R/site_common --timeout 45 --first-timeout 200 --start-timeout 150 \
   --case fused --case all-ranks-create-fails --case fused-call-raises --case one-rank-create-fails --case one-rank-fails-midway \
   --title "SGLang 0.5.23+sm120.1 (the patched cp312 wheel, installed), FlashInfer 0.7.2 as published: fused-norm layer path on one H200 (2 ranks sharing it)" \
   --note "capability query stubbed to 12.0 for callers in sglang.* only; FlashInfer builds and runs for the real SM90" \
   --note "TP group: a gloo group over the 2 rank processes; sgl_kernel replaced by an import stub, so the unfused norm is SGLang's forward_native" \
   --out $OUT/sglang-layer-cp312 > $OUT/layer-cp312.log 2>&1
echo "layer rc $? at $(( $(date +%s) - T0 )) s"; tail -12 $OUT/layer-cp312.log
# at most 8 files come back from a call: everything else travels in one archive
cd $OUT && tar czf $R/results.tgz -C $OUT . && mv $R/results.tgz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name layer-cp312.log ! -name gpu-test.log ! -name cp312-wheel.txt -exec rm -rf {} + ; ls $OUT
