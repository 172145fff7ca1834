#!/usr/bin/env bash
# Session 42, call 1 (one GPU): the persistent-cache and serialized-executable GPU tests
# (tests/test_gpu_cache.py), run-to-run determinism (tests/test_gpu_determinism.py), and
# tests/test_compile_cache.py + tests/test_environment.py under the machine's JAX. (The handler
# refusals, tests/test_gpu_faults.py, left out: little device time was left.)
O=$OUT; export OUT=/tmp/s42r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s42_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; tar -czf $O/logs.tgz -C $OUT .; exit 1; }
(cd build/obj && tar -czf $O/obj.tgz *.o)
STEP_TIMEOUT=200 GPU_FILES="tests/test_gpu_cache.py tests/test_gpu_determinism.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_gpu.txt 2>&1
JAX_PLATFORMS=cpu timeout 60 python3 -m pytest -q -p no:cacheprovider -ra tests/test_compile_cache.py tests/test_environment.py > $OUT/cpu_compile_cache.log 2>&1
python3 -m jax_flashoverlap.info > $OUT/info.json 2> $OUT/info.err; echo "info rc $?" >> $OUT/info.err
python3 -c "import jax; print('jax', jax.__version__)" > $OUT/jax_version.txt 2>&1
echo "== summary"; cat $OUT/gpu.txt $OUT/jax_version.txt; tail -2 $OUT/session_gpu.txt; grep -E '^(FAILED|ERROR)' $OUT/gpu_files.log | head; tail -2 $OUT/gpu_files.log; tail -2 $OUT/cpu_compile_cache.log; tail -2 $OUT/info.err
tar -czf $O/logs.tgz -C $OUT .
