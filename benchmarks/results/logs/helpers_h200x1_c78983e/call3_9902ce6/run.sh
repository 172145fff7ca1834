#!/usr/bin/env bash
# Session 17, call 3: helpers beside a whole GEMM (solo), then every GPU test file (helpers off: the default).
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:?} NCCL_NVLS_ENABLE=0
t0=$SECONDS
timeout 80 .build/gemm_helpers_test solo --iters 15 --json $OUT/helpers_solo.json > $OUT/helpers_solo.log 2>&1; echo "solo rc=$? $((SECONDS-t0))s"; grep -v "^device" $OUT/helpers_solo.log
t0=$SECONDS
bash scripts/gpu_session.sh build > $OUT/session.txt 2>&1; echo "build $((SECONDS-t0))s"
STEP_TIMEOUT=470 bash scripts/gpu_session.sh gpu_tests > $OUT/session_tests.txt 2>&1
tail -3 $OUT/session_tests.txt; grep -E "passed|failed" $OUT/gpu_tests.log | tail -2; grep -E "^FAILED|^ERROR" $OUT/gpu_tests.log | head
tar -czf $O/logs.tgz -C $OUT .
