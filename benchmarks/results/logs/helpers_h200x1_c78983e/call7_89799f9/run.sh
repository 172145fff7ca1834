#!/usr/bin/env bash
# Session 17, call 7: the review mend's test programs and call_frame.cc on the GPU.
O=$OUT; export OUT=/tmp/r7; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0
timeout 100 .build/gemm_helpers_test check --json $OUT/helpers_check.json > $OUT/helpers_check.log 2>&1; echo "helpers check rc=$?"; tail -1 $OUT/helpers_check.log
timeout 100 .build/gemm_ext_test all --json $OUT/ext.json > $OUT/ext.log 2>&1; echo "ext rc=$?"; tail -1 $OUT/ext.log
export PYTHONPATH=/tmp/site:$(pwd)
bash tests/cuda/build_overlap_harness.sh > $OUT/harness_build.log 2>&1; echo "harness build rc=$?"
FLASHOVERLAP_GEMM_HELPERS=on HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_on --calls 3 --m 2048 --n 1024 --k 512 --comm-sms 96 --ops ar,ar_out,rs > $OUT/harness_on.log 2>&1; echo "harness on rc=$?"; tail -1 $OUT/harness_on.log
FLASHOVERLAP_GEMM_HELPERS=bogus HARNESS_TIMEOUT=60 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_bogus --calls 1 --ops ar > $OUT/harness_bogus.log 2>&1; echo "harness bogus rc=$? (must fail, naming the variable)"; grep -h "FLASHOVERLAP_GEMM_HELPERS" $OUT/harness_bogus/*.out | head -2
tar -czf $O/logs.tgz -C $OUT .
