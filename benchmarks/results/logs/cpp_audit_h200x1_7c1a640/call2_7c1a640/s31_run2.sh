#!/usr/bin/env bash
# Session 31, call 2 (one GPU): GPU part 1 (ops, meshes, global views, Flax examples, large,
# in place, and the switch checks) and part 3 (peer stores, faults, watchdog, threads,
# harness, fuzz) after the session's C++ and Python changes.
O=$OUT; export OUT=/tmp/s31r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s31_run2.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
for part in 1 3; do
  GPU_PART=$part STEP_TIMEOUT=275 timeout 285 bash scripts/gpu_session.sh gpu_part > $OUT/session$part.txt 2>&1
  tail -1 $OUT/session$part.txt
  grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$part.log | tail -6
done
tar -czf $O/logs.tgz -C $OUT .
