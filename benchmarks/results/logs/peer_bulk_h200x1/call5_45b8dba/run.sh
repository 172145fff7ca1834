#!/usr/bin/env bash
# Session 23, call 5 (one GPU): the bulk mirrors moved into their own kernel instances
# (Config's kPeerStores_, picked for launches with several mirrors on 128 x 256 tiles), so the
# other instances' copy-out loop is spill-free again. Our GEMM alone against 40ded7d (old, new,
# new, old: the plain instances should now match), then the checks through the new instances
# (groups, also with spin waits; the sanitizers' group of 4; the pair; the standalone GEMM
# checks) and one bench_ring / bench_groups run.
O=$OUT; export OUT=/tmp/r5; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s23_run5.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build; OLD=tmp_device/old
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
i=0
for v in old new new old; do
  i=$((i+1)); bin=$B/gemm_test; [ $v = old ] && bin=$OLD/gemm_test_old
  run ge_bench_${v}_$i 100 $bin bench --json $OUT/ge_bench_${v}_$i.json
done
tar -czf $O/logs.tgz -C $OUT .
run pr_groups 240 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log)"
run pr_spin_groups 240 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test groups --json $OUT/pr_spin_groups.json
echo "spin groups PASS $(grep -c PASS $OUT/pr_spin_groups.log) FAIL $(grep -c FAIL $OUT/pr_spin_groups.log)"
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
run gemm_ext 120 $B/gemm_ext_test all --json $OUT/gemm_ext.json
run gemm_correct 120 $B/gemm_test correctness --json $OUT/gemm_correct.json
run gemm_signal 120 $B/gemm_test signal --json $OUT/gemm_signal.json
for tool in racecheck memcheck; do
  run san_$tool 150 "$SAN" --tool $tool --error-exitcode 9 $B/peer_reduce_test sanitize
done
tar -czf $O/logs.tgz -C $OUT .
run pr_bench_ring 150 $B/peer_reduce_test bench_ring --iters 10 --json $OUT/pr_bench_ring.json
run pr_bench_groups 120 $B/peer_reduce_test bench_groups --iters 10 --json $OUT/pr_bench_groups.json
tar -czf $O/logs.tgz -C $OUT .
echo "=== bench_ring"; grep -A16 "per-GPU" $OUT/pr_bench_ring.log | grep "| [48] "
echo "=== bench_groups"; grep -A6 "per-GPU" $OUT/pr_bench_groups.log | head -7
