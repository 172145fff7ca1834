#!/usr/bin/env bash
# Session 25, call 5 (one GPU): the new gpu_part step on the device (part 3: peer, faults,
# watchdog, threads, harness, fuzz), as the next multi-GPU session will run it.
O=$OUT; export OUT=/tmp/r5; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s25_run5.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
GPU_PART=3 STEP_TIMEOUT=420 timeout 500 bash scripts/gpu_session.sh build gpu_part > $OUT/session.txt 2>&1
tail -4 $OUT/session.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -4
tar -czf $O/logs.tgz -C $OUT .
