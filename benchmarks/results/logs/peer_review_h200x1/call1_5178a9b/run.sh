#!/usr/bin/env bash
# Session 26, call 1 (one GPU): the review's fixes (peer stores: the watchdog following the
# call's sequence, the driver asked which memory another GPU may write, the all-reduce staged
# in one process, system-scope counts and waits): the standalone checks (peer_access_test,
# GEMM correctness / signal, the peer sequence's check and groups, its pair timing against
# session 19-23's). Call 2: GPU part 3.
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s26_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run peer_access 60 .build/peer_access_test
run gemm_correctness 60 .build/gemm_test correctness --json $OUT/gemm_correctness.json
run gemm_signal 60 .build/gemm_test signal --json $OUT/gemm_signal.json
run pr_check 120 .build/peer_reduce_test check --json $OUT/pr_check.json
run pr_groups 120 .build/peer_reduce_test groups --json $OUT/pr_groups.json
run pr_bench 100 .build/peer_reduce_test bench --json $OUT/pr_bench.json
cat $OUT/peer_access.log | tail -14
tar -czf $O/logs.tgz -C $OUT .
