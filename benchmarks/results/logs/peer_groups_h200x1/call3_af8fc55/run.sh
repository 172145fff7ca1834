#!/usr/bin/env bash
# Session 21, call 3 (one GPU): the epilogue without the non-inlined mirror pass (mirrors after
# the first re-read per chunk in the serial loop; 0 spills, the kernel's stack frame back to
# 64 bytes): A/B of our GEMM and of the 2-rank peer bench against the previous kernels
# (*_old: 1f42b6d), the groups of 3/4/8 (the all-reduce's extra mirrors changed), the 2-rank
# checks, sanitizers, gemm_test correctness, the harness's loopback calls, and the GPU tests
# of test_gpu_peer.py (its refusal message updated) and test_gpu_harness.py.
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s21_run3.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for i in 1 2 3; do  # A/B, alternating, the order swapped each round (drift shows)
  if [ $i = 2 ]; then first=new; second=old; else first=old; second=new; fi
  for v in $first $second; do
    bin=$B/gemm_test; [ $v = old ] && bin=$B/gemm_test_old
    run ge_bench_${v}_$i 100 $bin bench --json $OUT/ge_bench_${v}_$i.json
  done
done
for i in 1 2; do
  run pr_bench_new_$i 100 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench_new_$i.json
  run pr_bench_old_$i 100 $B/peer_reduce_test_old bench --iters 10 --json $OUT/pr_bench_old_$i.json
done
run pr_groups 200 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log)"
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
run pr_spin_check 150 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test check --json $OUT/pr_spin_check.json
run pr_spin_break 60 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_test break --json $OUT/pr_spin_break.json
run pr_break 60 $B/peer_reduce_test break --json $OUT/pr_break.json
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
run pr_abort 60 $B/peer_reduce_test abort --json $OUT/pr_abort.json
run gemm_correct 120 $B/gemm_test correctness --json $OUT/gemm_correct.json
for tool in racecheck synccheck memcheck; do
  run san_$tool 150 "$SAN" --tool $tool --error-exitcode 9 $B/peer_reduce_test sanitize
done
tar -czf $O/logs.tgz -C $OUT .
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build harness_peer > $OUT/session_build.txt 2>&1; grep -A12 "==== summary" $OUT/session_build.txt
OUT=$OUT STEP_TIMEOUT=200 GPU_FILES="tests/test_gpu_peer.py tests/test_gpu_harness.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_files.txt 2>&1; tail -2 $OUT/session_files.txt
tar -czf $O/logs.tgz -C $OUT .
