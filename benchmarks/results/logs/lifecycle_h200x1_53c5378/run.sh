#!/usr/bin/env bash
# Session 15, call 1: the C++ lifecycle changes (destroy under calls, allocation agreement,
# BeginCall's stream order, comm_sms / flag checks) and the review fixes, on one H200.
O=$OUT; export OUT=/tmp/o1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=$(git rev-parse HEAD) NCCL_NVLS_ENABLE=0
nvidia-smi -L > $OUT/gpus.txt
GPU_FILES="tests/test_gpu_faults.py tests/test_gpu_threads.py tests/test_gpu_watchdog.py tests/test_gpu_cta_policy.py tests/test_gpu_a2a.py tests/test_gpu_gathered.py tests/test_gpu_in_place.py" \
  STEP_TIMEOUT=400 timeout 545 bash scripts/gpu_session.sh build harness sanitize_harness gpu_files > $OUT/session.txt 2>&1
tail -18 $OUT/session.txt
cat $OUT/harness_sanitize_summary.txt 2>/dev/null
grep -E "passed|failed|FAILED" $OUT/gpu_files.log | tail -12
tar -czf $O/logs.tgz -C $OUT .
