#!/usr/bin/env bash
# Session 34, call 1 (one GPU): session 32's unrun checks (GPU part 3: the hold-mutex harness
# test, agreement / ConnectPeers, the watchdog; the old watchdog's mutant must fail), session
# 33's transpose rule and layer backward on the GPU backend, bench smoke.
# the commit measured: any uncommitted edit (a helper's, mid-work) undone here
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s34r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s34_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; (cd tmp_device/clean && find . -type f) > $OUT/undone.txt
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build info > $OUT/session_build.txt 2>&1; tail -2 $OUT/session_build.txt
export PYTHONPATH="$(pwd)"
GPU_PART=3 STEP_TIMEOUT=290 timeout 295 bash scripts/gpu_session.sh gpu_part > $OUT/session3.txt 2>&1
tail -1 $OUT/session3.txt; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -4
for bin in overlap_harness overlap_harness_mut; do
  HARNESS_BIN=.build/$bin WORLD=1 timeout 90 bash tests/cuda/run_overlap_harness.sh none $OUT/hold_$bin \
    --inject hang --ops pr_rs --watchdog 2 --hold-mutex 5 > $OUT/hold_$bin.log 2>&1
  echo "hold_$bin rc=$?"; grep -h " hold: \| hang: " $OUT/hold_$bin.log $OUT/hold_$bin/*.log 2>/dev/null | head -4
done
timeout 200 python3 -m pytest -q -ra tests/test_transpose.py tests/test_layer_backward.py > $OUT/transpose_backward.log 2>&1
echo "transpose_backward rc=$?"; tail -2 $OUT/transpose_backward.log
STEP_TIMEOUT=120 timeout 130 bash scripts/gpu_session.sh bench_smoke > $OUT/session_bench.txt 2>&1; tail -4 $OUT/session_bench.txt
tar -czf $O/logs.tgz -C $OUT .
