#!/usr/bin/env bash
# Session 20, call 2 (one GPU): the GPU test files call 1 did not run, at the same tree.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s20_run2.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -2 $OUT/session_build.txt
OUT=$OUT STEP_TIMEOUT=${GPU_FILES_S:-480} GPU_FILES="tests/test_gpu.py tests/test_gpu_large.py tests/test_gpu_trace.py tests/test_gpu_cta_policy.py tests/test_gpu_transpose_w.py tests/test_gpu_global_view.py tests/test_gpu_gathered.py tests/test_gpu_a2a.py tests/test_gpu_fuzz.py tests/test_gpu_mesh.py tests/test_gpu_examples.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_files.txt 2>&1; tail -3 $OUT/session_files.txt
grep -h "passed\|failed\|FAILED\|Error" $OUT/gpu_files.log | tail -15
tar -czf $O/logs.tgz -C $OUT .
