#!/usr/bin/env bash
# Session 21, call 4 (one GPU, the last of the budget): what a group's sequence costs the GEMM
# on one GPU (bench_groups: self-groups of 2, 4 and 8, every store local), after the groups'
# and the self-groups' checks; the pair's check and the sanitizers on the rewritten self case.
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s21_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
run pr_groups 60 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log) self: $(grep -c '^self' $OUT/pr_groups.log)"
grep FAIL $OUT/pr_groups.log | head -3 | cut -c1-200
run pr_bench_groups 90 $B/peer_reduce_test bench_groups --iters 10 --json $OUT/pr_bench_groups.json
cat $OUT/pr_bench_groups.log
run pr_check 60 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
run san_racecheck 40 "$SAN" --tool racecheck --error-exitcode 9 $B/peer_reduce_test sanitize
tar -czf $O/logs.tgz -C $OUT .
