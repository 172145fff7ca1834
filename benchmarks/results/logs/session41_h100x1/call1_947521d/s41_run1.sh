#!/usr/bin/env bash
# Session 41, call 1 (one GPU): the launcher's 2^30 refusal (gemm_ext_test api, built on the
# CPU machine at this commit), the CPU suite under the GPU machine's JAX at this commit (the
# forward-mode, empty-row and docs tests of session 40 ran on JAX 0.10.x only), and the
# README's main job with defaults. Objects: .gpu_obj (kernel objects from the CPU machine).
O=$OUT; export OUT=/tmp/s41r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s41_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
python3 -c "import jax, jaxlib, flax; print(jax.__version__, jaxlib.__version__, flax.__version__)" >> $OUT/gpu.txt 2>&1
STEP_TIMEOUT=100 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; tar -czf $O/logs.tgz -C $OUT .; exit 1; }
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -gt 0 ] && tar -czf $O/obj.tgz -C build/obj "${new[@]}"
( time timeout 60 .build/gemm_ext_test api ) > $OUT/gemm_ext_api.log 2>&1; echo "rc $?" >> $OUT/gemm_ext_api.log
( time timeout 120 python3 examples/quickstart.py ) > $OUT/quickstart.log 2>&1; echo "rc $?" >> $OUT/quickstart.log
( time JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= timeout -s INT 300 python3 -m pytest -q -n 14 -p no:cacheprovider -ra tests ) > $OUT/cpu_suite.log 2>&1
echo "pytest rc $?" >> $OUT/cpu_suite.log
pip freeze > $OUT/pip_freeze.txt 2>/dev/null
echo "== summary"; cat $OUT/gpu.txt; tail -4 $OUT/gemm_ext_api.log; tail -3 $OUT/quickstart.log
grep -E '^(FAILED|ERROR)' $OUT/cpu_suite.log | head -40; tail -4 $OUT/cpu_suite.log
tar -czf $O/logs.tgz -C $OUT .
