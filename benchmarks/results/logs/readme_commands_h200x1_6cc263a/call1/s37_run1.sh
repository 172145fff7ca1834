#!/usr/bin/env bash
# Session 37, call 1 (one GPU): the README's test command on a GPU machine (session 35's
# s35_run1, refused then): setup_env must not try to install pytest-xdist there (no index),
# run_tests.sh must run one test at a time; then the rest of GPU part 1 at HEAD (session 36
# changed primitives.py's fallback, the Flax column checks, the bench record, the launcher).
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s37r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s37_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi -L > $OUT/gpus.txt 2>&1
python3 -c "import xdist" > $OUT/xdist_before.txt 2>&1; echo "import xdist rc $?" >> $OUT/xdist_before.txt
( time timeout 240 bash scripts/setup_env.sh ) > $OUT/setup_env.log 2>&1; echo "setup_env rc $?" >> $OUT/setup_env.log
( time timeout 170 bash scripts/run_tests.sh -ra tests/test_run_tests_script.py tests/test_gpu_build.py tests/test_gpu.py ) > $OUT/run_tests.log 2>&1; echo "run_tests rc $?" >> $OUT/run_tests.log
GPU_FILES="tests/test_gpu_mesh.py tests/test_gpu_global_view.py tests/test_gpu_examples.py tests/test_gpu_large.py tests/test_gpu_in_place.py tests/test_gpu_switch_checks.py" \
  GPU_FILES_SUFFIX=_part1_rest STEP_TIMEOUT=150 timeout 160 bash scripts/gpu_session.sh gpu_files > $OUT/session_part1.txt 2>&1
echo "== summary"; cat $OUT/gpus.txt; tail -1 $OUT/xdist_before.txt
grep -E "installing|extension built|setup_env rc|^real" $OUT/setup_env.log
grep -E "bringing up|workers|passed|failed|run_tests rc|^real" $OUT/run_tests.log | tail -6
tail -2 $OUT/session_part1.txt; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_files_part1_rest.log | tail -4
tar -czf $O/logs.tgz -C $OUT .
