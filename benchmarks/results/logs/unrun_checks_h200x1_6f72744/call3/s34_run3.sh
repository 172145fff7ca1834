#!/usr/bin/env bash
# Session 34, call 3 (one GPU, warm): benchmarks/fuzz.py (random shapes, plans, kernel switches;
# session 33 changed the plan search) at the commit.
# the commit measured: any uncommitted edit (a helper's, mid-work) undone here
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s34r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s34_run3.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
FUZZ_SECONDS=240 STEP_TIMEOUT=320 timeout 360 bash scripts/gpu_session.sh build fuzz > $OUT/session_fuzz.txt 2>&1; tail -2 $OUT/session_fuzz.txt
tar -czf $O/logs.tgz -C $OUT .
