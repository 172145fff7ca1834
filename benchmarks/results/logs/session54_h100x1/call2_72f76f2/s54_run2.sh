#!/usr/bin/env bash
# Session 54, call 2 (one GPU): the extension and the standalone kernel checks compiled by the
# newest CUDA toolkit on PyPI (cuda-toolkit 13.5.0: nvcc 13.5.37, its static cudart), which a
# user installing `nvidia-cuda-nvcc` today gets; everything before ran on nvcc 13.0 builds.
# Built on the CPU machine for this machine's Python 3.12 and NCCL 2.28.9 headers
# (tmp_device/cu135/: _xla_ffi.cpython-312-x86_64-linux-gnu.so, gemm_test, gemm_ext_test).
# 1. the 13.5 standalone checks (correctness, signal, extensions, three sanitizers);
# 2. JAX with the 13.5 extension: info, then GPU test files (part 1's and transpose_w,
#    control flow);
# 3. speed, 13.0 vs 13.5, alternating: `bench gemm` through JAX (the device's own 13.0 build,
#    `gpu_session.sh build`, against the carried 13.5 module) and `gemm_test bench`.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$SECONDS; LIMIT=${RUN_LIMIT:-570}
left() { echo $((LIMIT - (SECONDS - T0))); }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
C=tmp_device/cu135; SO=_xla_ffi.cpython-312-x86_64-linux-gnu.so
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
NCCL_LIB="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')/lib"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
echo "cublas $CUBLAS_LIB; nccl $NCCL_LIB; sanitizer $SAN" >> $S
step() {  # step NAME TIMEOUT CMD...: its output in $OUT/NAME.log, one summary line
  local name=$1 t=$2; shift 2; local t1=$SECONDS
  timeout $t "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t1)) s | $(grep -v '^\[flashoverlap' $OUT/$name.log | tail -n 1)" >> $S
}
# call 1's one failure, its test fixed (72f76f2): the no-GPU case on a machine with a GPU
step session_script 60 python3 -m pytest -q -p no:cacheprovider tests/test_session_script.py
# 1. standalone, 13.5
step cu135_correctness 60 $C/gemm_test correctness --json $OUT/cu135_correctness.json
step cu135_signal 30 $C/gemm_test signal
step cu135_ext 60 $C/gemm_ext_test all
step cu135_nk_correctness 60 env GEMM_TEST_TRANSPOSE_W=1 $C/gemm_test correctness
for tool in memcheck racecheck synccheck; do
  step cu135_$tool 90 $SAN --tool $tool --error-exitcode 3 $C/gemm_test sanitize
done
# the device's own 13.0 build (host objects compile here; kernel objects from .gpu_obj)
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=120 timeout 150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1
echo "build (13.0) rc=$? $((SECONDS - T0)) s" >> $S
mkdir -p /tmp/so130 && cp jax_flashoverlap/$SO /tmp/so130/
use() {  # use 130|135: put that build's module in the package
  if [ $1 = 135 ]; then cp $C/$SO jax_flashoverlap/$SO; else cp /tmp/so130/$SO jax_flashoverlap/$SO; fi
}
# 2. JAX with the 13.5 module
use 135
export LD_LIBRARY_PATH="$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step cu135_info 60 python3 -m jax_flashoverlap.info
FILES="tests/test_gpu_build.py tests/test_gpu.py tests/test_gpu_global_view.py tests/test_gpu_examples.py tests/test_gpu_large.py tests/test_gpu_in_place.py tests/test_gpu_switch_checks.py tests/test_gpu_transpose_w.py tests/test_gpu_control_flow.py"
t=$(( $(left) - 200 )); [ $t -gt 300 ] && t=300
step cu135_pytest $t python3 -m pytest -q -ra -p no:cacheprovider $FILES
# 3. speed, alternating
for r in 1 2; do
  for b in 130 135; do
    [ $(left) -gt 50 ] || { echo "jax_gemm r$r cu$b not run: $(left) s left" >> $S; continue; }
    use $b
    step jax_gemm_cu${b}_r$r 45 python3 -m jax_flashoverlap.bench gemm --comm-sms 0 8 16 --out $OUT/jax_gemm_cu${b}_r$r.json
  done
  for b in 130 135; do
    [ $(left) -gt 20 ] || { echo "gemm_test bench r$r cu$b not run" >> $S; continue; }
    bin=.build/gemm_test; [ $b = 135 ] && bin=$C/gemm_test
    step gemm_bench_cu${b}_r$r 20 $bin bench --json $OUT/gemm_bench_cu${b}_r$r.json
  done
done
use 130
cat $OUT/gpu.txt $S
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/cu135_pytest.log | tail -6
grep -E "cuda_runtime_compiled|nccl|kernel_build" $OUT/cu135_info.log
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
