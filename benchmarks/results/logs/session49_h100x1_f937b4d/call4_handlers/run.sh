#!/usr/bin/env bash
# Session 49, call 4 (one GPU, warm): the rest of f937b4d's handler paths: thread, harness and
# peer-store GPU tests (world 1 where they need more GPUs they skip).
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
GPU_FILES="tests/test_gpu_threads.py tests/test_gpu_harness.py tests/test_gpu_peer.py tests/test_gpu_trace.py" \
  STEP_TIMEOUT=400 timeout 540 bash scripts/gpu_session.sh build gpu_files > $OUT/session.txt 2>&1
echo "session rc=$?" >> $OUT/session.txt
sed -n '/==== summary/,$p' $OUT/session.txt
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && ls -la
