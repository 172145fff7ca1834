#!/usr/bin/env bash
# Session 23, call 1 (one GPU): the all-reduce's mirrors of a group of 3 or more stored by bulk
# copies from shared memory (MirrorStagedRows). Correctness first (groups of 3 / 4 / 8 separate
# ranks, with two new odd cases on 128 x 256 tiles; the API refusal; the pair's check), then
# timing, old (40ded7d: mirrors after the first re-read per 16-byte chunk, tmp_device/old/*)
# against new in the same call: bench_ring (old, new, new, old) and our GEMM alone
# (gemm_test bench, old, new).
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s23_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build; OLD=tmp_device/old
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
run pr_groups 240 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log)"
run gemm_ext 120 $B/gemm_ext_test all --json $OUT/gemm_ext.json
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
tar -czf $O/logs.tgz -C $OUT .
i=0
for v in old new new old; do
  i=$((i+1)); bin=$B/peer_reduce_test; [ $v = old ] && bin=$OLD/peer_reduce_test_old
  run pr_bench_ring_${v}_$i 150 $bin bench_ring --iters 10 --json $OUT/pr_bench_ring_${v}_$i.json
  tar -czf $O/logs.tgz -C $OUT .
done
for v in old new; do
  bin=$B/gemm_test; [ $v = old ] && bin=$OLD/gemm_test_old
  run ge_bench_${v}_1 100 $bin bench --json $OUT/ge_bench_${v}_1.json
done
tar -czf $O/logs.tgz -C $OUT .
for f in $OUT/pr_bench_ring_*.log; do echo "=== $(basename $f)"; grep -A8 "per-GPU" $f | head -8; done
