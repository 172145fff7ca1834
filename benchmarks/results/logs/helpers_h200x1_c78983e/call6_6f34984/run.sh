#!/usr/bin/env bash
# Session 17, call 6: the final tree's objects (every non-kernel object rebuilt here): the harness with and
# without helpers, the helpers' bad value refused by a call, the standalone helper check.
O=$OUT; export OUT=/tmp/r6; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:?} NCCL_NVLS_ENABLE=0
t0=$SECONDS; bash scripts/gpu_session.sh build > $OUT/session.txt 2>&1; echo "build $((SECONDS-t0))s"; grep -c "compiled" $OUT/build.log
export PYTHONPATH=/tmp/site:$(pwd)
bash tests/cuda/build_overlap_harness.sh > $OUT/harness_build.log 2>&1; echo "harness build rc=$?"
for h in on off; do
  FLASHOVERLAP_GEMM_HELPERS=$h HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_$h --calls 3 --m 2048 --n 1024 --k 512 --comm-sms 96 --ops ar,ar_out,rs > $OUT/harness_$h.log 2>&1; echo "harness $h rc=$?"; tail -1 $OUT/harness_$h.log
done
FLASHOVERLAP_GEMM_HELPERS=on HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_odd_on --m 320 --n 272 --k 200 --comm-sms 100 --ops ar,ar_out,rs > $OUT/harness_odd_on.log 2>&1; echo "harness odd on rc=$?"; tail -1 $OUT/harness_odd_on.log
FLASHOVERLAP_GEMM_HELPERS=on HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_trace_on --calls 2 --m 2048 --n 1024 --k 512 --comm-sms 96 --trace 1 --ops ar,rs > $OUT/harness_trace_on.log 2>&1; echo "harness trace on rc=$?"; tail -1 $OUT/harness_trace_on.log
timeout 60 python3 tmp_device/probe_env.py > $OUT/probe_env.log 2>&1; echo "probe rc=$?"; tail -4 $OUT/probe_env.log
timeout 100 .build/gemm_helpers_test check --json $OUT/helpers_check.json > $OUT/helpers_check.log 2>&1; echo "check rc=$?"; tail -1 $OUT/helpers_check.log
tar -czf $O/logs.tgz -C $OUT .
