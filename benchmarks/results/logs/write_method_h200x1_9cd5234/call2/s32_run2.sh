#!/usr/bin/env bash
# Session 32, call 2 (one GPU): GPU parts 1 and 3 at the write-method / counters change.
O=$OUT; export OUT=/tmp/s32r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s32_run2.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
for p in 1 3; do
  GPU_PART=$p STEP_TIMEOUT=280 timeout 285 bash scripts/gpu_session.sh gpu_part > $OUT/session$p.txt 2>&1
  tail -1 $OUT/session$p.txt
  grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -4
done
tar -czf $O/logs.tgz -C $OUT .
