#!/usr/bin/env bash
# Session 54, call 1 (one GPU): the CPU suite under the GPU machine's JAX (0.11.2 when last
# looked) at this commit, its last such run being session 41's at 947521d (since: the compile
# cache shared by the workers and its guard over a private JAX function, 244 more tests), with
# the workers' shared persistent cache as scripts/run_tests.sh sets it without a GPU; then the
# README's main job. Kernel and host objects come in .gpu_obj.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
python3 -c "import sys, jax, jaxlib, flax; print(sys.version.split()[0], jax.__version__, jaxlib.__version__, flax.__version__)" >> $OUT/gpu.txt 2>&1
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 timeout 200 bash scripts/gpu_session.sh build info > $OUT/session_build.txt 2>&1
echo "build rc=$? $((SECONDS - T0)) s" >> $OUT/summary.txt
cache=$(mktemp -d /tmp/jax_flashoverlap_tests.XXXXXX)
( time JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= JAX_FLASHOVERLAP_TEST_CACHE_DIR=$cache PYTHONPATH=. \
    timeout -s INT 380 python3 -m pytest -q -n 14 -p no:cacheprovider -ra tests ) > $OUT/cpu_suite.log 2>&1
echo "cpu suite rc=$? $((SECONDS - T0)) s; cache files $(find $cache -type f | wc -l)" >> $OUT/summary.txt
( time PYTHONPATH=. timeout 90 python3 examples/quickstart.py ) > $OUT/quickstart.log 2>&1
echo "quickstart rc=$? $((SECONDS - T0)) s" >> $OUT/summary.txt
pip freeze > $OUT/pip_freeze.txt 2>/dev/null
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cat $OUT/gpu.txt $OUT/summary.txt
grep -E '^(FAILED|ERROR)' $OUT/cpu_suite.log | head -40; tail -4 $OUT/cpu_suite.log; tail -3 $OUT/quickstart.log
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
