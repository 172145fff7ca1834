#!/usr/bin/env bash
# Session 20, call 1 (one GPU): what session 19 compiled but never ran. The peer waits' abort
# flag (peer_reduce_test abort, a peer that never comes, both tiles), the regressions of that
# kernel change (flags, check, bench, gemm_test correctness), the 2-GPU program's refusal on one
# GPU, and the GPU tests whose code the review mend touched (workspace growth through
# GrowMemberBuffers, faults, watchdog, threads, in-place, the peer refusal).
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s20_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
run pr_abort 60 $B/peer_reduce_test abort --json $OUT/pr_abort.json
run pr_abort256 60 env FLASHOVERLAP_GEMM_TILE=256 $B/peer_reduce_test abort --json $OUT/pr_abort256.json
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
run pr_bench 70 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench.json
grep -v "^device" $OUT/pr_bench.log | head -7
run gemm_correct 100 $B/gemm_test correctness --json $OUT/gemm_correct.json
run pr2_one_gpu 30 $B/peer_reduce_2gpu_test check  # one GPU: must refuse (exit 2), naming why
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build harness harness_peer > $OUT/session_build.txt 2>&1; grep -A30 "==== summary" $OUT/session_build.txt
grep -h " OK\| FAIL\|NOT \|next call" $OUT/hpeer*/none_r0.out | cut -c1-160 | head -30
OUT=$OUT STEP_TIMEOUT=${GPU_FILES_S:-300} GPU_FILES="tests/test_gpu_harness.py tests/test_gpu_faults.py tests/test_gpu_watchdog.py tests/test_gpu_peer.py tests/test_gpu_threads.py tests/test_gpu_in_place.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_files.txt 2>&1; tail -3 $OUT/session_files.txt
grep -h "passed\|failed\|FAILED\|Error" $OUT/gpu_files.log | tail -15
tar -czf $O/logs.tgz -C $OUT .
