#!/usr/bin/env bash
# Session 39, call 8: after call 7 (the CPU suite under JAX 0.11.2: 11 failed), with the
# reference lowering traced with every mesh axis manual: probe_bwd.py (what XLA 0.11.2's CPU
# program computes for a column layer's backward psum, against ours and two models), then the
# whole CPU suite again under JAX 0.11.2, as call 7.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r8; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run8.sh tmp_device/probe_bwd.py $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=100 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= timeout 100 python3 tmp_device/probe_bwd.py > $OUT/probe_bwd.log 2>&1; echo "probe rc $?" >> $OUT/probe_bwd.log
( time JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= timeout -s INT 400 python3 -m pytest -q -n 14 -p no:cacheprovider -ra tests ) > $OUT/cpu_suite.log 2>&1
echo "pytest rc $?" >> $OUT/cpu_suite.log
echo "== summary"; cat $OUT/probe_bwd.log | cut -c1-300; grep -E '^(FAILED|ERROR)' $OUT/cpu_suite.log | head -40; tail -4 $OUT/cpu_suite.log
tar -czf $O/logs.tgz -C $OUT .
