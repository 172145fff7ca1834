#!/usr/bin/env bash
# Session 23, call 4 (one GPU): a peer-store call's word operations batched, one stream
# operation per step (4cb5412, cuStreamBatchMemOp). Checks first (groups with stream-op waits:
# the batches; with spin waits: one kernel per word as before; the pair's check and break),
# then timing against the unbatched sequence (tmp_device/exp/peer_reduce_test_unbatched: the
# same test and kernels linked with peer_reduce.cc of 2b35e00): bench_groups, bench_ring and the
# pair's bench, interleaved; then the handler's loopback peer calls (harness_peer).
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s23_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build; U=tmp_device/exp/peer_reduce_test_unbatched
run pr_groups 240 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log)"
run pr_spin_groups 240 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test groups --json $OUT/pr_spin_groups.json
echo "spin groups PASS $(grep -c PASS $OUT/pr_spin_groups.log) FAIL $(grep -c FAIL $OUT/pr_spin_groups.log)"
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
run pr_break 60 $B/peer_reduce_test break --json $OUT/pr_break.json
tar -czf $O/logs.tgz -C $OUT .
i=0
for v in unbatched batched batched unbatched; do
  i=$((i+1)); bin=$B/peer_reduce_test; [ $v = unbatched ] && bin=$U
  run pr_bench_groups_${v}_$i 120 $bin bench_groups --iters 10 --json $OUT/pr_bench_groups_${v}_$i.json
done
for v in unbatched batched; do
  i=$((i+1)); bin=$B/peer_reduce_test; [ $v = unbatched ] && bin=$U
  run pr_bench_ring_${v}_$i 150 $bin bench_ring --iters 10 --json $OUT/pr_bench_ring_${v}_$i.json
  run pr_bench_${v}_$i 100 $bin bench --iters 10 --json $OUT/pr_bench_${v}_$i.json
done
tar -czf $O/logs.tgz -C $OUT .
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build harness_peer > $OUT/session_build.txt 2>&1; grep -A14 "==== summary" $OUT/session_build.txt
tar -czf $O/logs.tgz -C $OUT .
for f in $OUT/pr_bench_groups_*.log; do echo "=== $(basename $f)"; grep -A6 "per-GPU" $f | head -7; done
for f in $OUT/pr_bench_ring_*.log; do echo "=== $(basename $f)"; grep -A16 "per-GPU" $f | grep "| [48] " | head -4; done
