#!/usr/bin/env bash
# Session 17, call 4: repeatability of the helpers' solo and emulated-collective numbers, and solo with whole tails.
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
for rep in 1 2; do
  timeout 60 .build/gemm_helpers_test solo --iters 15 --json $OUT/helpers_solo_$rep.json > $OUT/helpers_solo_$rep.log 2>&1; echo "solo $rep rc=$?"; grep -v "^device\|failure" $OUT/helpers_solo_$rep.log
done
timeout 60 env FLASHOVERLAP_GEMM_TAIL=whole .build/gemm_helpers_test solo --iters 15 --json $OUT/helpers_solo_whole.json > $OUT/helpers_solo_whole.log 2>&1; echo "solo whole rc=$?"; grep -v "^device\|failure" $OUT/helpers_solo_whole.log
timeout 100 .build/gemm_helpers_test bench --iters 15 --json $OUT/helpers_bench_2.json > $OUT/helpers_bench_2.log 2>&1; echo "bench rc=$?"; grep -v "^device\|failure" $OUT/helpers_bench_2.log
tar -czf $O/logs.tgz -C $OUT .
