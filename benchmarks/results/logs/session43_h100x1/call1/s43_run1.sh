#!/usr/bin/env bash
# Session 43, call 1 (one GPU): session 42 call 2 never ran; its checks after the fixes (handlers registered at import, the all-gather forced on one GPU), plus the examples on a GPU after their defaults changed.
# (tests/test_gpu_cache.py), run-to-run determinism (tests/test_gpu_determinism.py), and
# tests/test_compile_cache.py + tests/test_environment.py under the machine's JAX. (And the handler
# refusals, tests/test_gpu_faults.py, after the no-communicator message changed.)
O=$OUT; export OUT=/tmp/s43r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s43_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; tar -czf $O/logs.tgz -C $OUT .; exit 1; }
(cd build/obj && tar -czf $O/obj.tgz *.o)
STEP_TIMEOUT=330 GPU_FILES="tests/test_gpu_cache.py tests/test_gpu_determinism.py tests/test_gpu_faults.py tests/test_gpu_examples.py" bash scripts/gpu_session.sh gpu_files > $OUT/session_gpu.txt 2>&1
JAX_PLATFORMS=cpu timeout 60 python3 -m pytest -q -p no:cacheprovider -ra tests/test_compile_cache.py tests/test_environment.py > $OUT/cpu_compile_cache.log 2>&1
python3 -m jax_flashoverlap.info > $OUT/info.json 2> $OUT/info.err; echo "info rc $?" >> $OUT/info.err
python3 -c "import jax; print('jax', jax.__version__)" > $OUT/jax_version.txt 2>&1
echo "== summary"; cat $OUT/gpu.txt $OUT/jax_version.txt; tail -2 $OUT/session_gpu.txt; grep -E '^(FAILED|ERROR)' $OUT/gpu_files.log | head; tail -2 $OUT/gpu_files.log; tail -2 $OUT/cpu_compile_cache.log; tail -2 $OUT/info.err
tar -czf $O/logs.tgz -C $OUT .
