#!/usr/bin/env bash
# Session 39, call 10: the whole CPU suite under JAX 0.11.2 (as calls 7 and 8) after the
# reference lowering's fix (b08feac) and the tests' fixes (b21c877).
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r10; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run10.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=100 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
( time JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= timeout -s INT 330 python3 -m pytest -q -n 14 -p no:cacheprovider -ra tests ) > $OUT/cpu_suite.log 2>&1
echo "pytest rc $?" >> $OUT/cpu_suite.log
echo "== summary"; grep -E '^(FAILED|ERROR)' $OUT/cpu_suite.log | head -40; tail -4 $OUT/cpu_suite.log
tar -czf $O/logs.tgz -C $OUT .
