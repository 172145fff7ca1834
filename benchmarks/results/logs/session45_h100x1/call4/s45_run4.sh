#!/usr/bin/env bash
# Session 45, call 4 (one GPU): GPU part 3 (peer stores, faults, watchdog, threads, harness,
# fuzz) and the new workspace test at COMMIT.
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
STEP_TIMEOUT=60 GPU_FILES="tests/test_gpu_memory.py" GPU_FILES_SUFFIX=_memory bash scripts/gpu_session.sh gpu_files > $OUT/session_gpu_memory.txt 2>&1
STEP_TIMEOUT=400 GPU_PART=3 bash scripts/gpu_session.sh gpu_part > $OUT/session_gpu_part3.txt 2>&1
echo "== summary"; tail -1 $OUT/session_build.txt $OUT/session_gpu_memory.txt $OUT/session_gpu_part3.txt; grep -hE '^(FAILED|ERROR)' $OUT/*.log | head -20
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
