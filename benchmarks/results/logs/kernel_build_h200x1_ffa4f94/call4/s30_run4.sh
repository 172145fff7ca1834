#!/usr/bin/env bash
# Session 30, call 4 (one GPU): GPU part 1 (ops, global views, Flax examples) after the Flax row
# layers started naming their axis to the global view always (e4fa873).
O=$OUT; export OUT=/tmp/s30r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s30_run4.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
GPU_PART=1 STEP_TIMEOUT=260 timeout 270 bash scripts/gpu_session.sh gpu_part > $OUT/session1.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part1.log | tail -4
tar -czf $O/logs.tgz -C $OUT .
