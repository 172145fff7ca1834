#!/usr/bin/env bash
# Session 23, call 2 (one GPU): the rest of the checks of the bulk-copied mirrors and the A/B:
# our GEMM alone again (new, old: call 1 ran old, new), bench_groups (a rank that is every
# rank, all SMs) new and old, compute-sanitizer (racecheck, synccheck, memcheck) on
# `peer_reduce_test sanitize` (now with a group of 4 that is this rank: the bulk mirrors),
# the groups check with spin-kernel waits, our GEMM's standalone checks, the pair's break /
# flags, the handler's loopback peer calls (harness_peer) and the 1-GPU GPU tests.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s23_run2.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build; OLD=tmp_device/old
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
for v in new old; do
  bin=$B/gemm_test; [ $v = old ] && bin=$OLD/gemm_test_old
  run ge_bench_${v}_2 100 $bin bench --json $OUT/ge_bench_${v}_2.json
done
tar -czf $O/logs.tgz -C $OUT .
# Where the all-reduce's remaining cost at 4 / 8 ranks lies (experiment binaries, not committed
# code: tmp_device/exp, the 128 x 256 bf16 overlapped instance patched): v1 issues no bulk copy
# (mirrored rows missing: timing only), v4 every 4th row's; new between them.
for v in v1 new v4; do
  bin=$B/peer_reduce_test; [ $v != new ] && bin=tmp_device/exp/peer_reduce_test_$v
  run pr_bench_ring_exp_$v 150 $bin bench_ring --iters 10 --json $OUT/pr_bench_ring_exp_$v.json
done
tar -czf $O/logs.tgz -C $OUT .
for tool in racecheck synccheck memcheck; do
  run san_$tool 150 "$SAN" --tool $tool --error-exitcode 9 $B/peer_reduce_test sanitize
done
run pr_spin_groups 240 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test groups --json $OUT/pr_spin_groups.json
echo "spin groups PASS $(grep -c PASS $OUT/pr_spin_groups.log) FAIL $(grep -c FAIL $OUT/pr_spin_groups.log)"
run gemm_correct 120 $B/gemm_test correctness --json $OUT/gemm_correct.json
run gemm_signal 120 $B/gemm_test signal --json $OUT/gemm_signal.json
run pr_break 60 $B/peer_reduce_test break --json $OUT/pr_break.json
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
tar -czf $O/logs.tgz -C $OUT .
for v in new old; do
  bin=$B/peer_reduce_test; [ $v = old ] && bin=$OLD/peer_reduce_test_old
  run pr_bench_groups_$v 120 $bin bench_groups --iters 10 --json $OUT/pr_bench_groups_$v.json
done
tar -czf $O/logs.tgz -C $OUT .
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build harness_peer > $OUT/session_build.txt 2>&1; grep -A14 "==== summary" $OUT/session_build.txt
tar -czf $O/logs.tgz -C $OUT .
for v in v1 new v4; do echo "=== exp $v"; grep -A16 "per-GPU" $OUT/pr_bench_ring_exp_$v.log | grep "| [48] "; done
echo "=== bench_groups new"; grep -A6 "per-GPU" $OUT/pr_bench_groups_new.log | head -7
echo "=== bench_groups old"; grep -A6 "per-GPU" $OUT/pr_bench_groups_old.log | head -7
