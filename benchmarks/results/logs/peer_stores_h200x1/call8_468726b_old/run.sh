#!/usr/bin/env bash
# Session 19, call 3: the pre-ring kernel (468726b) on today's GPU: does its 8192 check show the
# same split-tail bit differences? (geometry logged)
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s19_run3.sh $OUT/run.sh
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-110)"; }
run old_check 150 env FLASHOVERLAP_GEMM_LOG=1 tmp_device/peer_reduce_test_old check --json $OUT/old_check.json
echo "old check PASS $(grep -c PASS $OUT/old_check.log) FAIL $(grep -c FAIL $OUT/old_check.log)"; grep FAIL $OUT/old_check.log | head -4
grep "M=8192" $OUT/old_check.log | head
run old_check2 150 tmp_device/peer_reduce_test_old check --json $OUT/old_check2.json
echo "old check again PASS $(grep -c PASS $OUT/old_check2.log) FAIL $(grep -c FAIL $OUT/old_check2.log)"
tar -czf $O/logs.tgz -C $OUT .
