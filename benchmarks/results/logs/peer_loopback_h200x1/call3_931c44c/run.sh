#!/usr/bin/env bash
# Session 20, call 3 (one GPU): a failed peer-store call breaks the pair (931c44c:
# EnqueueBreakPair, the GEMM's peer waits read a failed word; the all-reduce's step 3 waits
# for the peer's done word instead of per-tile gathered counters). peer_reduce_test break
# (stream-op and spin waits), the regressions of the kernel / protocol change (flags, check
# bits, abort, bench, sanitizers), gemm_test, the harness's loopback peer calls, then the
# harness's NCCL-path ops.
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s20_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
run pr_break 60 $B/peer_reduce_test break --json $OUT/pr_break.json
grep "^break" $OUT/pr_break.log | cut -c1-230
run pr_break_spin 60 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test break --json $OUT/pr_break_spin.json
grep "^break" $OUT/pr_break_spin.log | cut -c1-230
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
run pr_abort 60 $B/peer_reduce_test abort --json $OUT/pr_abort.json
run pr_bench 100 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench.json
grep -v "^device" $OUT/pr_bench.log | head -7
for tool in racecheck synccheck memcheck; do
  run san_$tool 150 "$SAN" --tool $tool --error-exitcode 9 $B/peer_reduce_test sanitize
done
run gemm_correct 100 $B/gemm_test correctness --json $OUT/gemm_correct.json
run pr_badmode 20 $B/peer_reduce_test chek   # must exit 2
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build harness_peer > $OUT/session_build.txt 2>&1; grep -A24 "==== summary" $OUT/session_build.txt
grep -h "injected\|next call" $OUT/hpeer_inject*/none_r0.out | cut -c1-200
tar -czf $O/logs.tgz -C $OUT .   # what there is so far, in case the lease ends
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh harness > $OUT/session_harness.txt 2>&1; grep -A10 "==== summary" $OUT/session_harness.txt
tar -czf $O/logs.tgz -C $OUT .
