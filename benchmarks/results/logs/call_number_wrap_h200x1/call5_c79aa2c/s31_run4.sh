#!/usr/bin/env bash
# Session 31, call 4 (one GPU): the peer stores' call numbers across their wrap past 2^31.
# (Call 5 re-ran it with wait_wrap added: the waits themselves across the int32 wrap.)
# .build/peer_reduce_test_before: the tree before the fix (the test's --first-call hook
# only); .build/peer_reduce_test: with it (the spin wait compares cyclically, as the stream
# operation does; the break writes relative to the rank's calls). Both built here (nvcc 13).
# --first-call 2147483645: the third call's number is INT32_MIN.
O=$OUT; export OUT=/tmp/s31r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s31_run4.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(grep -c PASS $OUT/$name.log) PASS, $(grep -c FAIL $OUT/$name.log) FAIL; $(tail -1 $OUT/$name.log | cut -c1-120)"; }
W=2147483645
run before_wait_wrap 30 .build/peer_reduce_test_before wait_wrap
run after_wait_wrap 30 .build/peer_reduce_test wait_wrap
run before_spin_check 60 env JAX_FLASHOVERLAP_WAIT=spin .build/peer_reduce_test_before check --first-call $W
run after_spin_check 60 env JAX_FLASHOVERLAP_WAIT=spin .build/peer_reduce_test check --first-call $W
run before_break 45 .build/peer_reduce_test_before break --first-call $W
run after_break 45 .build/peer_reduce_test break --first-call $W
run after_spin_break 45 env JAX_FLASHOVERLAP_WAIT=spin .build/peer_reduce_test break --first-call $W
run after_check 60 .build/peer_reduce_test check --first-call $W
run after_check_from0 60 .build/peer_reduce_test check
run after_break_from0 45 .build/peer_reduce_test break
run after_groups_spin 60 env JAX_FLASHOVERLAP_WAIT=spin .build/peer_reduce_test groups --first-call $W
tar -czf $O/logs.tgz -C $OUT .
