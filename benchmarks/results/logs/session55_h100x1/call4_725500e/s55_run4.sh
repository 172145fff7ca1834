#!/usr/bin/env bash
# Session 55, call 4 (one H100, warm): the README's two commands' setup on the GPU machine at
# this session's setup.py (nvcc and the CUDA headers must now be one release): setup_env.sh
# (the carried object cache in build/obj), then the main job; the build's nvcc and headers.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
S=$OUT/summary.txt
rm -rf build/obj .venv && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
{ command -v nvcc; nvcc --version | tail -2; echo "CUDA_HOME=${CUDA_HOME:-unset}"; grep -h "define CUDART_VERSION" /usr/local/cuda/include/cuda_runtime_api.h; } > $OUT/toolkit.txt 2>&1
t1=$SECONDS; timeout 300 bash scripts/setup_env.sh > $OUT/setup_env.log 2>&1
echo "setup_env rc=$? $((SECONDS - t1)) s | $(tail -n 1 $OUT/setup_env.log)" >> $S
t1=$SECONDS; timeout 200 .venv/bin/python examples/quickstart.py > $OUT/quickstart.log 2>&1
echo "quickstart rc=$? $((SECONDS - t1)) s | $(tail -n 2 $OUT/quickstart.log | tr '\n' ' ')" >> $S
cat $OUT/toolkit.txt $S
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && ls -la
