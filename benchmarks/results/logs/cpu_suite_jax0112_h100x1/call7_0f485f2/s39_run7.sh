#!/usr/bin/env bash
# Session 39, call 7: the CPU test suite (8 simulated devices, the reference path) under the
# GPU machine's JAX 0.11.2, which CI (the package index: JAX 0.10.2 at newest) never runs; the
# GPU suite had passed on 0.11.2 already. GPUs hidden from JAX and CUDA; 14 pytest-xdist
# workers on its 16 cores; SIGINT at 470 s so pytest still prints what it finished.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r7; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run7.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
STEP_TIMEOUT=100 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
python3 -c "import jax, jaxlib, flax, xdist; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__)" > $OUT/versions.txt 2>&1
( time JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= timeout -s INT 470 python3 -m pytest -q -n 14 -p no:cacheprovider -ra --durations=25 tests ) > $OUT/cpu_suite.log 2>&1
echo "pytest rc $?" >> $OUT/cpu_suite.log
echo "== summary"; cat $OUT/versions.txt; grep -E '^(FAILED|ERROR)' $OUT/cpu_suite.log | head -40; tail -4 $OUT/cpu_suite.log
tar -czf $O/logs.tgz -C $OUT .
