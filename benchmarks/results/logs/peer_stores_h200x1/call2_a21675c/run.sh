#!/usr/bin/env bash
# Session 18, call 2: do copies need an SM? (probe), then the self-peer sequence at comm_sms 0 / 2.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
B=.build
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-120)"; }
run probe 30 $B/copy_engine_probe
cat $OUT/probe.log
run bench0 90 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench0.json
grep -v "^device" $OUT/bench0.log | head -8
run bench2 90 env PEER_REDUCE_COMM_SMS=2 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench2.json
grep -v "^device" $OUT/bench2.log | head -8
run check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
grep -c PASS $OUT/check.log; grep FAIL $OUT/check.log | head -5
tar -czf $O/logs.tgz -C $OUT .
