#!/usr/bin/env bash
# Session 21, call 2 (one GPU): after the kernel change of 2fbbb92 (head groups per
# destination, several mirrors), the GPU test files one GPU can run (the harness, faults,
# watchdog, peer, threads, in-place first; then the ops, large shapes, transpose_w, fuzz, ...),
# and our GEMM through JAX against XLA's dot (README's table) for a speed regression.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s21_run2.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -2 $OUT/session_build.txt
OUT=$OUT STEP_TIMEOUT=200 GPU_FILES_SUFFIX=_a GPU_FILES="tests/test_gpu_harness.py tests/test_gpu_faults.py tests/test_gpu_watchdog.py tests/test_gpu_peer.py tests/test_gpu_threads.py tests/test_gpu_in_place.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_files_a.txt 2>&1; tail -2 $OUT/session_files_a.txt
tar -czf $O/logs.tgz -C $OUT .
OUT=$OUT STEP_TIMEOUT=${GPU_FILES_S:-330} GPU_FILES_SUFFIX=_b GPU_FILES="tests/test_gpu.py tests/test_gpu_large.py tests/test_gpu_transpose_w.py tests/test_gpu_fuzz.py tests/test_gpu_trace.py tests/test_gpu_cta_policy.py tests/test_gpu_global_view.py tests/test_gpu_gathered.py tests/test_gpu_a2a.py tests/test_gpu_mesh.py tests/test_gpu_examples.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_files_b.txt 2>&1; tail -2 $OUT/session_files_b.txt
grep -h "passed\|failed\|FAILED\|Error" $OUT/gpu_files_a.log $OUT/gpu_files_b.log | tail -12
tar -czf $O/logs.tgz -C $OUT .
OUT=$OUT STEP_TIMEOUT=150 bash scripts/gpu_session.sh gemm_bench > $OUT/session_gemm.txt 2>&1; tail -12 $OUT/gemm_bench.log
tar -czf $O/logs.tgz -C $OUT .
