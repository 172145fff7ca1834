#!/usr/bin/env bash
# Session 22, call 1 (one GPU): the ring reduction in the epilogue (c14c689 kernel, e7432bf
# sequence). Correctness first (groups of 3/4/8 separate ranks against float32 and the ring's
# rounded running sum bit for bit; the pair's check), then timing, old (861f800: the star,
# tmp_device/old/*) against new in the same call: our GEMM alone (gemm_test bench, A/B, order
# swapped), the 2-rank peer bench, bench_groups (a rank that is every rank) and bench_ring
# (separate ranks at once on SMs / world).
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s22_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build; OLD=tmp_device/old
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
run pr_groups 200 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log)"
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
tar -czf $O/logs.tgz -C $OUT .
for v in new old; do
  bin=$B/peer_reduce_test; [ $v = old ] && bin=$OLD/peer_reduce_test_old
  run pr_bench_ring_$v 150 $bin bench_ring --iters 10 --json $OUT/pr_bench_ring_$v.json
  run pr_bench_groups_$v 120 $bin bench_groups --iters 10 --json $OUT/pr_bench_groups_$v.json
done
tar -czf $O/logs.tgz -C $OUT .
for i in 1 2; do  # A/B, the order swapped in round 2 (drift shows)
  if [ $i = 2 ]; then first=new; second=old; else first=old; second=new; fi
  for v in $first $second; do
    bin=$B/gemm_test; [ $v = old ] && bin=$OLD/gemm_test_old
    run ge_bench_${v}_$i 100 $bin bench --json $OUT/ge_bench_${v}_$i.json
  done
done
run pr_bench_new 100 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench_new.json
run pr_bench_old 100 $OLD/peer_reduce_test_old bench --iters 10 --json $OUT/pr_bench_old.json
tar -czf $O/logs.tgz -C $OUT .
echo "=== bench_ring new"; grep -A20 "per-GPU" $OUT/pr_bench_ring_new.log | head -18
echo "=== bench_ring old"; grep -A20 "per-GPU" $OUT/pr_bench_ring_old.log | head -18
