#!/usr/bin/env bash
# Session 37 call 4, run in session 38 (one GPU): setup.py's new object keys (CUDA toolkit + compiler name) on
# the GPU machine: the carried objects must be found there (only module.cc compiles: another
# Python), the build's kernel digest reported; then the harness (world 1) linked from the
# carried objects, and the build test (the device budget left allows no more).
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s37r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s37_run4.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; nvidia-smi -L > $OUT/gpus.txt 2>&1
grep -h "define CUDART_VERSION" /usr/local/cuda/include/cuda_runtime_api.h > $OUT/cudart.txt 2>&1; nvcc --version >> $OUT/cudart.txt 2>&1
STEP_TIMEOUT=75 timeout 80 bash scripts/gpu_session.sh build info > $OUT/session_build.txt 2>&1
STEP_TIMEOUT=30 timeout 75 bash scripts/gpu_session.sh harness > $OUT/session_harness.txt 2>&1
GPU_FILES="tests/test_gpu_build.py" GPU_FILES_SUFFIX=_build STEP_TIMEOUT=35 timeout 40 bash scripts/gpu_session.sh gpu_files > $OUT/session_gpu.txt 2>&1
echo "== summary"; cat $OUT/gpus.txt $OUT/cudart.txt | head -3
grep -c "cached" $OUT/build.log; grep "compiled\|built " $OUT/build.log | head -5; grep -o '"kernel_build": "[0-9a-f]*"' $OUT/info.log | head -1
grep -E "rc=" $OUT/session_harness.txt; tail -1 $OUT/session_gpu.txt
tar -czf $O/logs.tgz -C $OUT .
