#!/usr/bin/env bash
# Session 19, call 1: the add ring (cp.async partial loads): flags (both tile shapes), check (alternating
# ring / serial calls, bit-equal), sanitizers on the ring, bench A/B twice, GEMM regression checks.
mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
B=.build
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-110)"; }
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
run pr_flags256 60 env FLASHOVERLAP_GEMM_TILE=256 $B/peer_reduce_test flags --json $OUT/pr_flags256.json
grep -h "flags:" $OUT/pr_flags.log $OUT/pr_flags256.log
run pr_bench_1 100 $B/peer_reduce_test bench --iters 15 --json $OUT/pr_bench_1.json
grep -v "^device" $OUT/pr_bench_1.log | head -8
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log)"; grep FAIL $OUT/pr_check.log | head -5
run pr_check256 150 env FLASHOVERLAP_GEMM_TILE=256 $B/peer_reduce_test check --json $OUT/pr_check256.json
echo "check256 PASS $(grep -c PASS $OUT/pr_check256.log)"; grep FAIL $OUT/pr_check256.log | head -5
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for tool in racecheck synccheck memcheck; do
  run san_$tool 150 env FLASHOVERLAP_GEMM_TILE=256 $SAN --tool $tool --error-exitcode 3 $B/peer_reduce_test sanitize
  grep -h "SUMMARY" $OUT/san_$tool.log | head -1
done
run pr_bench_2 100 $B/peer_reduce_test bench --iters 15 --json $OUT/pr_bench_2.json
grep -v "^device" $OUT/pr_bench_2.log | head -8
run gemm_correct 120 $B/gemm_test correctness --json $OUT/gemm_correct.json
run gemm_signal 60 $B/gemm_test signal --json $OUT/gemm_signal.json
run ext 60 $B/gemm_ext_test all --json $OUT/ext.json
