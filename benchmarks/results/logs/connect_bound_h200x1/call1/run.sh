#!/usr/bin/env bash
# Session 29, call 1 (one GPU): ConnectPeers bounded through RunBoundedSetupGroup (21b9e8a):
# agreement_test both ways (now with ConnectPeers' missing peer), the harness at world 1
# (ConnectPeers on its point-to-point communicator, every op), GPU part 3.
O=$OUT; export OUT=/tmp/s29r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s29_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run agreement 60 .build/agreement_test
run abort_never_ends 60 .build/agreement_test --abort-never-ends
run harness 150 env WORLD=1 bash tests/cuda/run_overlap_harness.sh none $OUT/harness --calls 4
GPU_PART=3 STEP_TIMEOUT=270 timeout 290 bash scripts/gpu_session.sh build gpu_part > $OUT/session3.txt 2>&1
tail -2 $OUT/session3.txt
echo "---- agreement"; cat $OUT/agreement.log
echo "---- part 3"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -6
tar -czf $O/logs.tgz -C $OUT .
