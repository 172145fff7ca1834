#!/usr/bin/env bash
# Session 44, call 1 (one GPU): the package as an installed wheel with the CUDA extension, run
# from outside the checkout (every earlier GPU run imported the checkout, extension built in place).
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
echo "commit ${COMMIT:-?}" > $OUT/installed_import.txt
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
# The derivatives' reference changed (no cond in a fully manual shard_map): the GPU tests of
# gradients / tangents, our kernels in the forward.
STEP_TIMEOUT=200 PYTEST_K="grad or jvp or vjp or backward" bash scripts/gpu_session.sh gpu_k > $OUT/session_gpu_k.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/wheelpkg tmp_device/wheelwhl/*.whl
python3 -c "import setuptools; print('setuptools', setuptools.__version__)" > $OUT/wheel_build.log 2>&1
# The wheel: its build reuses build/obj (keys do not depend on the checkout's path).
PYTHONPATH=/tmp/wheelpkg:/tmp/site JAX_FLASHOVERLAP_BUILD_CUDA=1 timeout 300 python3 -m pip wheel -v \
  --no-build-isolation --no-deps --no-index -w /tmp/whl . >> $OUT/wheel_build.log 2>&1; echo "wheel rc=$?" | tee -a $OUT/wheel_build.log
ls -la /tmp/whl | tee -a $OUT/wheel_build.log
python3 -m zipfile -l /tmp/whl/*.whl | grep -E "_xla_ffi|_build_note|configs" | tee -a $OUT/wheel_build.log
python3 -m pip install -q --no-index --no-deps --target /tmp/inst /tmp/whl/*.whl; echo "install rc=$?"
mkdir -p /tmp/qs && cp examples/*.py /tmp/qs/
cd /tmp/qs
export PYTHONPATH=/tmp/inst:/tmp/site
python3 -c "import jax_flashoverlap as f, jax_flashoverlap._ext as e; print(f.__file__); print('ext', e.HAS_CUDA_EXT, e.EXT_IMPORT_ERROR, e.ext.__file__ if e.ext else None)" >> $OUT/installed_import.txt 2>&1
timeout 120 python3 -m jax_flashoverlap.info > $OUT/installed_info.json 2>> $OUT/installed_import.txt; echo "info rc=$?" >> $OUT/installed_import.txt
timeout 180 python3 quickstart.py > $OUT/installed_examples.txt 2>&1; echo "quickstart rc=$?" >> $OUT/installed_examples.txt
timeout 180 python3 global_view_jit.py >> $OUT/installed_examples.txt 2>&1; echo "global_view_jit rc=$?" >> $OUT/installed_examples.txt
echo "== summary"; tail -2 $OUT/session_gpu_k.txt; grep -E "^(FAILED|ERROR)" $OUT/gpu_k.log | head; tail -1 $OUT/gpu_k.log; cat $OUT/installed_import.txt; grep -E '"extension_built"|"nccl_version"|"gpu_name"' $OUT/installed_info.json; grep -E "rc=|path:|relative error|error" $OUT/installed_examples.txt | head -20; grep -E "wheel rc|_xla_ffi|_build_note" $OUT/wheel_build.log
