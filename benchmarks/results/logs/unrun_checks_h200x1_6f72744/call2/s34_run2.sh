#!/usr/bin/env bash
# Session 34, call 2 (one GPU): GPU parts 1 and 2 at the commit (session 33 changed the
# communicators' creation, the plans, the bench and the primitives), then launch_smoke.
# the commit measured: any uncommitted edit (a helper's, mid-work) undone here
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s34r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s34_run2.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; (cd tmp_device/clean && find . -type f) > $OUT/undone.txt
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
for p in 1 2; do
  GPU_PART=$p STEP_TIMEOUT=260 timeout 265 bash scripts/gpu_session.sh gpu_part > $OUT/session$p.txt 2>&1
  tail -1 $OUT/session$p.txt; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -4
done
STEP_TIMEOUT=60 timeout 100 bash scripts/gpu_session.sh launch_smoke > $OUT/session_launch.txt 2>&1; tail -4 $OUT/session_launch.txt
tar -czf $O/logs.tgz -C $OUT .
