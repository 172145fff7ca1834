#!/usr/bin/env bash
# Session 18, call 3: peer stores (no copies): checks, sanitizers, self-peer bench at comm_sms 0,
# and the kernel change's regression checks (gemm_test, ext, helpers, harness).
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0
B=.build
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-110)"; }
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
grep "flags:" $OUT/pr_flags.log
run pr_bench 90 $B/peer_reduce_test bench --iters 10 --json $OUT/pr_bench.json
grep -v "^device" $OUT/pr_bench.log | head -8
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for tool in racecheck synccheck memcheck; do
  run san_$tool 120 $SAN --tool $tool --error-exitcode 3 $B/peer_reduce_test sanitize
  grep -h "SUMMARY" $OUT/san_$tool.log | head -1
done
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
grep -c PASS $OUT/pr_check.log; grep FAIL $OUT/pr_check.log | head -5
run gemm_correct 120 $B/gemm_test correctness --json $OUT/gemm_correct.json
run gemm_signal 60 $B/gemm_test signal --json $OUT/gemm_signal.json
run ext 60 $B/gemm_ext_test all --json $OUT/ext.json
run helpers_check 100 $B/gemm_helpers_test check --json $OUT/helpers_check.json
export PYTHONPATH=/tmp/site:$(pwd)
run harness_build 150 bash tests/cuda/build_overlap_harness.sh
run harness 120 env HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness --calls 3
tar -czf $O/logs.tgz -C $OUT .
