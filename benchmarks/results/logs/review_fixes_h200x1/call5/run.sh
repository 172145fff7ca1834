#!/usr/bin/env bash
# Session 28, call 5 (one GPU): the refactor at f3ceb02 (one abort for the watchdog, the
# agreement and the destroy): agreement_test both ways, peer_access_test, GPU part 3
# (watchdog, faults, harness, peer tests).
O=$OUT; export OUT=/tmp/s28r5; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s28_run5.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run agreement 60 .build/agreement_test
run abort_never_ends 60 .build/agreement_test --abort-never-ends
run peer_access 60 .build/peer_access_test
GPU_PART=3 STEP_TIMEOUT=260 timeout 280 bash scripts/gpu_session.sh build gpu_part > $OUT/session3.txt 2>&1
tail -2 $OUT/session3.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -6
tar -czf $O/logs.tgz -C $OUT .
