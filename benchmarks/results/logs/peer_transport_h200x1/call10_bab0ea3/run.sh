#!/usr/bin/env bash
# Session 19, call 5 (one GPU): the GPU tests call 4 did not reach (its suite hit the step
# limit at 51%, one failure: the handler-refusal script lacked the new attribute), the
# refusal test first.
O=$OUT; export OUT=/tmp/r5; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s19_run5.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -2 $OUT/session_build.txt
OUT=$OUT STEP_TIMEOUT=${GPU_FILES_S:-400} GPU_FILES="tests/test_gpu_faults.py tests/test_gpu_peer.py tests/test_gpu_transpose_w.py tests/test_gpu_watchdog.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_files.txt 2>&1; tail -3 $OUT/session_files.txt
grep -h "passed\|failed\|FAILED\|Error" $OUT/gpu_files.log | tail -15
tar -czf $O/logs.tgz -C $OUT .
