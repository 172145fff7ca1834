#!/usr/bin/env bash
# Session 26, call 4 (one GPU): GPU parts 2 and 1 at the session's code (communicators now load
# every GEMM instance when made; the review's fixes), each bounded.
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s26_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
GPU_PART=2 STEP_TIMEOUT=250 timeout 290 bash scripts/gpu_session.sh build gpu_part > $OUT/session2.txt 2>&1
GPU_PART=1 STEP_TIMEOUT=250 timeout 270 bash scripts/gpu_session.sh gpu_part > $OUT/session1.txt 2>&1
tail -2 $OUT/session2.txt; tail -2 $OUT/session1.txt
for p in 2 1; do grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -5; done
tar -czf $O/logs.tgz -C $OUT .
