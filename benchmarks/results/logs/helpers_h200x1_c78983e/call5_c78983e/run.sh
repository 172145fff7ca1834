#!/usr/bin/env bash
# Session 17, call 5: the emulated-collective bench with a whole-tail helpers column, twice.
O=$OUT; export OUT=/tmp/r5; rm -rf $OUT; mkdir -p $OUT
for rep in 1 2; do
  timeout 100 .build/gemm_helpers_test bench --iters 15 --json $OUT/helpers_bench_whole_$rep.json > $OUT/helpers_bench_whole_$rep.log 2>&1; echo "bench $rep rc=$?"; grep -v "^device\|failure" $OUT/helpers_bench_whole_$rep.log
done
tar -czf $O/logs.tgz -C $OUT .
