#!/usr/bin/env bash
# Session 26, call 3 (one GPU): after communicators load every GEMM instance when made (call 2's
# two hang tests had timed out: the injected wait blocked the first GEMM launch's module
# load). Standalone checks again, then GPU part 3.
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s26_run3.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run peer_access 60 .build/peer_access_test
run gemm_correctness 60 .build/gemm_test correctness --json $OUT/gemm_correctness.json
run pr_check 120 .build/peer_reduce_test check --json $OUT/pr_check.json
run pr_break 120 .build/peer_reduce_test break --json $OUT/pr_break.json
GPU_PART=3 STEP_TIMEOUT=460 timeout 500 bash scripts/gpu_session.sh build gpu_part > $OUT/session.txt 2>&1
tail -3 $OUT/session.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -8
tar -czf $O/logs.tgz -C $OUT .
