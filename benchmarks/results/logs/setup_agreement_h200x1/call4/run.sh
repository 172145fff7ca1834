#!/usr/bin/env bash
# Session 27, call 4 (one GPU): GPU part 2 at the bounded-agreement commit (parts 1 and 3: call 3).
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s27_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
GPU_PART=2 STEP_TIMEOUT=300 timeout 330 bash scripts/gpu_session.sh build gpu_part > $OUT/session2.txt 2>&1
tail -2 $OUT/session2.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part2.log | tail -6
tar -czf $O/logs.tgz -C $OUT .
