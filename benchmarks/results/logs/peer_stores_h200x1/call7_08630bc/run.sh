#!/usr/bin/env bash
# Session 19, call 2: call 1 again with its logs (tar: only 8 files come back), plus the 8192 bit
# differences explained: geometry log (FLASHOVERLAP_GEMM_LOG) and the check with FLASHOVERLAP_GEMM_TAIL=whole.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
B=.build
nvidia-smi --query-gpu=name,clocks.sm,power.limit,serial --format=csv > $OUT/gpu.txt 2>&1
echo "commit ${COMMIT:-?}" > $OUT/commit.txt; cp tmp_device/s19_run2.sh $OUT/run.sh
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-110)"; }
run pr_flags 60 $B/peer_reduce_test flags --json $OUT/pr_flags.json
run pr_flags256 60 env FLASHOVERLAP_GEMM_TILE=256 $B/peer_reduce_test flags --json $OUT/pr_flags256.json
run pr_check_log 150 env FLASHOVERLAP_GEMM_LOG=1 $B/peer_reduce_test check --json $OUT/pr_check_log.json
echo "check PASS $(grep -c PASS $OUT/pr_check_log.log) FAIL $(grep -c FAIL $OUT/pr_check_log.log)"; grep -i "clusters\|split" $OUT/pr_check_log.log | sort | uniq | head -20
run pr_check_whole 150 env FLASHOVERLAP_GEMM_TAIL=whole $B/peer_reduce_test check --json $OUT/pr_check_whole.json
echo "whole-tail check PASS $(grep -c PASS $OUT/pr_check_whole.log) FAIL $(grep -c FAIL $OUT/pr_check_whole.log)"
run pr_check256_whole 150 env FLASHOVERLAP_GEMM_TAIL=whole FLASHOVERLAP_GEMM_TILE=256 $B/peer_reduce_test check --json $OUT/pr_check256_whole.json
echo "whole-tail 256 check PASS $(grep -c PASS $OUT/pr_check256_whole.log) FAIL $(grep -c FAIL $OUT/pr_check256_whole.log)"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for tool in racecheck synccheck memcheck; do
  run san_$tool 150 env FLASHOVERLAP_GEMM_TILE=256 $SAN --tool $tool --error-exitcode 3 $B/peer_reduce_test sanitize
  grep -h "SUMMARY" $OUT/san_$tool.log | head -1
done
run pr_bench 100 $B/peer_reduce_test bench --iters 15 --json $OUT/pr_bench.json
grep -v "^device" $OUT/pr_bench.log | head -8
tar -czf $O/logs.tgz -C $OUT .
