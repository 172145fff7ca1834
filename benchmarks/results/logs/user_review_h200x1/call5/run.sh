#!/usr/bin/env bash
# Session 29, call 5 (one GPU): GPU part 2 (the a2a ops connect their peers at lowering) after the review fixes.
O=$OUT; export OUT=/tmp/s29r5; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s29_run5.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
GPU_PART=2 STEP_TIMEOUT=280 timeout 300 bash scripts/gpu_session.sh build gpu_part > $OUT/session2.txt 2>&1
tail -2 $OUT/session2.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part2.log | tail -6
tar -czf $O/logs.tgz -C $OUT .
