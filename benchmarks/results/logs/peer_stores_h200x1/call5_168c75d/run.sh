#!/usr/bin/env bash
# Session 18, call 5: where the peer-store sequence's time goes (grouping vs bands), twice; check again.
O=$OUT; export OUT=/tmp/r5; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
B=.build
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-110)"; }
for i in 1 2; do
  run pr_bench_$i 90 $B/peer_reduce_test bench --iters 15 --json $OUT/pr_bench_$i.json
  grep -v "^device" $OUT/pr_bench_$i.log | head -8
done
run pr_check 100 $B/peer_reduce_test all --iters 3 --json $OUT/pr_all.json
grep -c PASS $OUT/pr_check.log; grep FAIL $OUT/pr_check.log | head -5
tar -czf $O/logs.tgz -C $OUT .
