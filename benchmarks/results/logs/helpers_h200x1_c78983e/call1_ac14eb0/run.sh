#!/usr/bin/env bash
# Session 17, call 1: the helper launches, standalone (no JAX): checks, sanitizers, emulated bench, harness.
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0
B=.build
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
t0=$SECONDS
timeout 150 $B/gemm_helpers_test check --json $OUT/helpers_check.json > $OUT/helpers_check.log 2>&1; echo "check rc=$? $((SECONDS-t0))s"
tail -3 $OUT/helpers_check.log; grep -c PASS $OUT/helpers_check.log; grep FAIL $OUT/helpers_check.log | head
t0=$SECONDS
timeout 120 env GEMM_TEST_TRANSPOSE_W=1 $B/gemm_helpers_test check --json $OUT/helpers_check_nk.json > $OUT/helpers_check_nk.log 2>&1; echo "check_nk rc=$? $((SECONDS-t0))s"
tail -1 $OUT/helpers_check_nk.log
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for tool in racecheck synccheck memcheck; do
  t0=$SECONDS
  timeout 150 $SAN --tool $tool --error-exitcode 3 $B/gemm_helpers_test sanitize > $OUT/san_$tool.log 2>&1; echo "san $tool rc=$? $((SECONDS-t0))s"
  grep -h "SUMMARY\|failure" $OUT/san_$tool.log | head -3
done
for f in 0.3 0.6; do
  t0=$SECONDS
  timeout 120 $B/gemm_helpers_test bench --iters 20 --comm-fraction $f --json $OUT/helpers_bench_$f.json > $OUT/helpers_bench_$f.log 2>&1; echo "bench $f rc=$? $((SECONDS-t0))s"
  grep -v "^device" $OUT/helpers_bench_$f.log | head -9
done
export PYTHONPATH=/tmp/site:$(pwd)
t0=$SECONDS
bash tests/cuda/build_overlap_harness.sh > $OUT/harness_build.log 2>&1; echo "harness build rc=$? $((SECONDS-t0))s"
for h in on off; do
  t0=$SECONDS
  FLASHOVERLAP_GEMM_HELPERS=$h HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_$h --calls 3 --m 2048 --n 1024 --k 512 --comm-sms 96 --ops ar,ar_out,rs > $OUT/harness_$h.log 2>&1; echo "harness $h rc=$? $((SECONDS-t0))s"
  tail -4 $OUT/harness_$h.log
done
t0=$SECONDS
FLASHOVERLAP_GEMM_HELPERS=on HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_odd_on --m 320 --n 272 --k 200 --comm-sms 100 --ops ar,ar_out,rs > $OUT/harness_odd_on.log 2>&1; echo "harness odd on rc=$? $((SECONDS-t0))s"
tail -3 $OUT/harness_odd_on.log
tar -czf $O/logs.tgz -C $OUT .
