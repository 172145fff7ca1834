#!/usr/bin/env bash
# Session 43, call 4 (one GPU): GPU parts 3 (peer, faults, watchdog, threads, harness, fuzz) and 2
# (a2a, gathered, transpose_w, cta policy, trace; part 4 ran in call 1) at COMMIT, logs straight into $OUT so a cut call keeps them.
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s43_run4.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=120 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
STEP_TIMEOUT=250 GPU_PART=3 bash scripts/gpu_session.sh gpu_part > $OUT/session_gpu_part3.txt 2>&1
STEP_TIMEOUT=230 GPU_PART=2 bash scripts/gpu_session.sh gpu_part > $OUT/session_gpu_part2.txt 2>&1
echo "== summary"; tail -1 $OUT/session_build.txt; tail -1 $OUT/session_gpu_part3.txt; tail -1 $OUT/session_gpu_part2.txt; grep -hE '^(FAILED|ERROR)' $OUT/gpu_part*.log | head
