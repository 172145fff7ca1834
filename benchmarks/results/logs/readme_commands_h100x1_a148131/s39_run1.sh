#!/usr/bin/env bash
# Session 39, call 1 (one GPU): the README's two commands on a GPU machine after session 38
# changed how they count GPUs (scripts/_gpus.sh gpu_count: grep -c reads all of nvidia-smi's
# output; grep -q under pipefail could read a GPU machine as having none). setup_env must not
# install pytest-xdist there and must build the extension, run_tests.sh must start no workers,
# the main job must take the CUDA path; gpu_session.sh (also on gpu_count now) must see the GPU.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi -L > $OUT/gpus.txt 2>&1
( source scripts/_gpus.sh; echo "gpu_count $(gpu_count)" ) > $OUT/gpu_count.txt 2>&1
( time timeout 240 bash scripts/setup_env.sh ) > $OUT/setup_env.log 2>&1; echo "setup_env rc $?" >> $OUT/setup_env.log
( time timeout 120 .venv/bin/python examples/quickstart.py ) > $OUT/quickstart.log 2>&1; echo "quickstart rc $?" >> $OUT/quickstart.log
( time timeout 200 bash scripts/run_tests.sh -ra tests/test_run_tests_script.py tests/test_setup_env_script.py tests/test_session_script.py tests/test_gpu_build.py tests/test_gpu.py ) > $OUT/run_tests.log 2>&1; echo "run_tests rc $?" >> $OUT/run_tests.log
STEP_TIMEOUT=60 timeout 70 bash scripts/gpu_session.sh info > $OUT/session_info.txt 2>&1; echo "gpu_session rc $?" >> $OUT/session_info.txt
echo "== summary"; cat $OUT/gpus.txt $OUT/gpu_count.txt
grep -E "installing|xdist|extension built|setup_env rc|^real" $OUT/setup_env.log
grep -E "relative|error|backend|path|quickstart rc|^real" $OUT/quickstart.log | tail -6
grep -E "workers|passed|failed|run_tests rc|^real" $OUT/run_tests.log | tail -5
tail -4 $OUT/session_info.txt
tar -czf $O/logs.tgz -C $OUT .
