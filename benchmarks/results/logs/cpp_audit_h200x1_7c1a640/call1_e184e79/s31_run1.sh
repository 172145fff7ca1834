#!/usr/bin/env bash
# Session 31, call 1 (one GPU): the C++ audit's refusals (gemm_ext_test api: the launcher's
# integer variables; tests/test_gpu_switch_checks.py, in GPU part 2: set after lowering, and
# communicator setup), the standalone GEMM's correctness with the launcher change, the
# JAX-free harness at world 1 (every op, spin waits, growth from a second thread, injected
# failures), then GPU part 2.
O=$OUT; export OUT=/tmp/s31r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s31_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
run ext_api 90 .build/gemm_ext_test api --json $OUT/ext_api.json
grep -E "FLASHOVERLAP_GEMM|FAIL" $OUT/ext_api.log | cut -c1-160
run gemm_correct 150 .build/gemm_test correctness --quick
grep -c PASS $OUT/gemm_correct.log; grep -c FAIL $OUT/gemm_correct.log
STEP_TIMEOUT=100 timeout 420 bash scripts/gpu_session.sh harness > $OUT/session_harness.txt 2>&1
cat $OUT/session_harness.txt | tail -8
GPU_PART=2 STEP_TIMEOUT=250 timeout 260 bash scripts/gpu_session.sh gpu_part > $OUT/session2.txt 2>&1
tail -1 $OUT/session2.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part2.log | tail -6
tar -czf $O/logs.tgz -C $OUT .
