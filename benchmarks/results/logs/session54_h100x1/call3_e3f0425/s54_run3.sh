#!/usr/bin/env bash
# Session 54, call 3 (one GPU): the 13.0 and 13.5 builds' speed again, in balanced orders
# (call 2 always timed 13.0 first; one cell, 4096 x 8192 x 4096 at comm_sms 8, had 13.5 4%
# ahead in both runs): `bench gemm` through JAX A B B A, `gemm_test bench` A B B A B A A B;
# then the GPU test files call 2 left out (part 2's all-to-all, gathered, CTA policy, trace;
# part 4's cache, determinism, memory, mesh order) with the 13.5 module, as time allows.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$SECONDS; LIMIT=${RUN_LIMIT:-570}
left() { echo $((LIMIT - (SECONDS - T0))); }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
C=tmp_device/cu135; SO=_xla_ffi.cpython-312-x86_64-linux-gnu.so
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
NCCL_LIB="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')/lib"
step() {  # step NAME TIMEOUT CMD...: its output in $OUT/NAME.log, one summary line
  local name=$1 t=$2; shift 2; local t1=$SECONDS
  timeout $t "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t1)) s | $(grep -v '^\[flashoverlap' $OUT/$name.log | tail -n 1)" >> $S
}
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=120 timeout 150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1
echo "build (13.0) rc=$? $((SECONDS - T0)) s" >> $S
mkdir -p /tmp/so130 && cp jax_flashoverlap/$SO /tmp/so130/
use() { if [ $1 = 135 ]; then cp $C/$SO jax_flashoverlap/$SO; else cp /tmp/so130/$SO jax_flashoverlap/$SO; fi; }
export LD_LIBRARY_PATH="$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
i=0
for b in 130 135 135 130; do
  i=$((i + 1)); [ $(left) -gt 200 ] || { echo "jax_gemm $i cu$b not run" >> $S; continue; }
  use $b
  step jax_gemm_${i}_cu$b 45 python3 -m jax_flashoverlap.bench gemm --comm-sms 0 8 16 --out $OUT/jax_gemm_${i}_cu$b.json
done
i=0
for b in 130 135 135 130 135 130 130 135; do
  i=$((i + 1)); [ $(left) -gt 150 ] || { echo "gemm_bench $i cu$b not run" >> $S; continue; }
  bin=.build/gemm_test; [ $b = 135 ] && bin=$C/gemm_test
  step gemm_bench_${i}_cu$b 20 $bin bench --json $OUT/gemm_bench_${i}_cu$b.json
done
use 135
for f in a2a gathered cta_policy trace cache determinism memory mesh_order; do
  t=$(( $(left) - 15 )); [ $t -gt 30 ] || { echo "test_gpu_$f not run: $(left) s left" >> $S; continue; }
  step pytest_$f $t python3 -m pytest -q -ra -p no:cacheprovider tests/test_gpu_$f.py
done
use 130
cat $OUT/gpu.txt $S
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
