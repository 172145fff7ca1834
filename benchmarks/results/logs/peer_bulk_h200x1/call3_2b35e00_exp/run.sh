#!/usr/bin/env bash
# Session 23, call 3 (one GPU): v5 (tmp_device/exp/peer_reduce_test_v5: the 128 x 256 bf16
# overlapped instance with bulk-mirrored tiles waiting for the mirrors' stamps in the one
# issuing lane instead of in all 96 copy-out threads) against new (2b35e00): groups checks of v5, v7full,
# then bench_ring new, v5, v6, v7full, v7full, v6, v5, new (v6: v5 without any wait for the stamps, the
# pointers read as they are: unsafe, timing only; v7: v5 with each copy-out warp reading the
# bases once per launch into shared memory; v7full: v7 with every kernel object and test
# rebuilt from it); our GEMM alone old, new, v7full, v7full, new, old; sanitizers on v7full.
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s23_run3.sh $OUT/run.sh; cp tmp_device/exp/*.patch $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build; X=tmp_device/exp
for v in v5 v7full; do
  run pr_groups_$v 240 $X/peer_reduce_test_$v groups --json $OUT/pr_groups_$v.json
  echo "$v groups PASS $(grep -c PASS $OUT/pr_groups_$v.log) FAIL $(grep -c FAIL $OUT/pr_groups_$v.log)"
done
i=0
for v in new v5 v6 v7full v7full v6 v5 new; do
  i=$((i+1)); bin=$B/peer_reduce_test; [ $v != new ] && bin=$X/peer_reduce_test_$v
  run pr_bench_ring_${v}_$i 150 $bin bench_ring --iters 10 --json $OUT/pr_bench_ring_${v}_$i.json
  tar -czf $O/logs.tgz -C $OUT .
done
# our GEMM alone, two more A/B rounds (calls 1 and 2 ran old-new and new-old)
for v in old new v7full v7full new old; do
  i=$((i+1)); bin=$B/gemm_test; [ $v = old ] && bin=tmp_device/old/gemm_test_old; [ $v = v7full ] && bin=$X/gemm_test_v7full
  run ge_bench_${v}_$i 100 $bin bench --json $OUT/ge_bench_${v}_$i.json
done
tar -czf $O/logs.tgz -C $OUT .
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for tool in racecheck synccheck memcheck; do
  run san_v7full_$tool 150 "$SAN" --tool $tool --error-exitcode 9 $X/peer_reduce_test_v7full sanitize
done
tar -czf $O/logs.tgz -C $OUT .
for f in $OUT/pr_bench_ring_*.log; do echo "=== $(basename $f)"; grep -A16 "per-GPU" $f | grep "| [48] "; done
