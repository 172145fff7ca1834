#!/usr/bin/env bash
# Session 25, call 1 (one GPU): a release check at HEAD: the standalone GEMM checks, the whole
# GPU test suite (its last whole run was session 12's; files ran alone since), the
# peer-store harness calls (a rank its own peer).
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s25_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run gemm_correctness 60 .build/gemm_test correctness --json $OUT/gemm_correctness.json
run gemm_signal 60 .build/gemm_test signal --json $OUT/gemm_signal.json
STEP_TIMEOUT=440 timeout 540 bash scripts/gpu_session.sh build info gpu_tests harness_peer > $OUT/session.txt 2>&1
tail -16 $OUT/session.txt
grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | head
tar -czf $O/logs.tgz -C $OUT .
