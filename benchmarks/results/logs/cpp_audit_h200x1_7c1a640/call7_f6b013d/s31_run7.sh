#!/usr/bin/env bash
# Session 31, call 7 (one GPU): the review's C++ fixes: the launcher's TILE message
# (gemm_ext_test api, TILE=300 added), the injected hang relative to the calls
# (tests/test_gpu_harness.py: the watchdog ends it), the peer-store harness at world 1 (carried .build).
O=$OUT; export OUT=/tmp/s31r7; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s31_run7.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
STEP_TIMEOUT=100 timeout 110 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
run ext_api 60 .build/gemm_ext_test api
grep -E "TILE|FAIL" $OUT/ext_api.log | cut -c1-170
export PYTHONPATH=/tmp/site:$PWD
run harness_tests 150 env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -ra -m "gpu or multigpu" tests/test_gpu_harness.py
run hpeer 40 env WORLD=1 bash tests/cuda/run_overlap_harness.sh none $OUT/hpeer --ops pr_rs,pr_ar --calls 4
run hpeer_spin 40 env WORLD=1 JAX_FLASHOVERLAP_WAIT=spin bash tests/cuda/run_overlap_harness.sh none $OUT/hpeer_spin --ops pr_rs,pr_ar
tar -czf $O/logs.tgz -C $OUT .
