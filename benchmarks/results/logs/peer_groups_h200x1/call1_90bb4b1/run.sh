#!/usr/bin/env bash
# Session 21, call 1 (one GPU): peer stores for groups of 2 to 8 ranks (head groups per
# destination, several partial-sum sources and mirrors in the kernel). The spin-wait emulated
# pair (session 20's timeout; the tests' emulated ranks now load the wait / write kernels up
# front), groups of 3/4/8 emulated, the 2-rank regressions (flags, check bits, break, abort,
# sanitizers, the harness's loopback calls), and A/B of the kernel change against the
# previous objects (gemm_test / peer_reduce_test *_old: 1f42b6d kernels) in one process each.
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s21_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
run pr_spin_break 60 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test break --json $OUT/pr_spin_break.json
grep "^break" $OUT/pr_spin_break.log | cut -c1-200
run pr_groups 200 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log)"; grep FAIL $OUT/pr_groups.log | head -5 | cut -c1-200
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
run pr_spin_check 150 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test check --json $OUT/pr_spin_check.json
echo "spin check PASS $(grep -c PASS $OUT/pr_spin_check.log) FAIL $(grep -c FAIL $OUT/pr_spin_check.log)"
run pr_break 60 $B/peer_reduce_test break --json $OUT/pr_break.json
grep "PASS\|FAIL" $OUT/pr_break.log | cut -c1-160
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
run pr_abort 60 $B/peer_reduce_test abort --json $OUT/pr_abort.json
run gemm_correct 120 $B/gemm_test correctness --json $OUT/gemm_correct.json
tar -czf $O/logs.tgz -C $OUT .   # what there is so far, in case the lease ends
for i in 1 2; do  # A/B: the kernels before (old) and after, alternating
  run ge_bench_old_$i 100 $B/gemm_test_old bench --json $OUT/ge_bench_old_$i.json
  run ge_bench_new_$i 100 $B/gemm_test bench --json $OUT/ge_bench_new_$i.json
  run pr_bench_old_$i 100 $B/peer_reduce_test_old bench --iters 10 --json $OUT/pr_bench_old_$i.json
  run pr_bench_new_$i 100 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench_new_$i.json
done
for tool in racecheck synccheck memcheck; do
  run san_$tool 150 "$SAN" --tool $tool --error-exitcode 9 $B/peer_reduce_test sanitize
done
tar -czf $O/logs.tgz -C $OUT .
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build harness_peer > $OUT/session_build.txt 2>&1; grep -A24 "==== summary" $OUT/session_build.txt
tar -czf $O/logs.tgz -C $OUT .
