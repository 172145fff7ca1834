#!/usr/bin/env bash
# Session 51, call 1 (one GPU): session 50's unrun checks. A failed peer-store growth left not
# connected (harness --inject grow on both peer-store ops; the mutant that reverts the fix must
# FAIL); the harness's peer calls; the __syncwarp kernels' standalone checks (3ceb69b, never
# run); whether the GPU flushes remote writes in a stream wait; the fault and harness GPU tests.
# Kernel objects come in .gpu_obj (built here); host objects compile on the device (~20 s).
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
T0=$SECONDS; LIMIT=${RUN_LIMIT:-580}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
python3 - >> $OUT/gpu.txt 2>&1 <<'PY'
import ctypes
cu = ctypes.CDLL("libcuda.so.1"); v = ctypes.c_int()
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
for name, attr in [("CAN_FLUSH_REMOTE_WRITES", 98), ("CAN_USE_STREAM_WAIT_VALUE_NOR", 100)]:
    rc = cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
    print(f"CU_DEVICE_ATTRIBUTE_{name} ({attr}): rc={rc} value={v.value}")
PY
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 timeout 300 bash scripts/gpu_session.sh build harness_peer > $OUT/session.txt 2>&1
echo "session rc=$?" >> $OUT/session.txt
{
  bash tests/cuda/mutants/build_mutants.sh > $OUT/mutants_build.log 2>&1; echo "mutants build rc=$?"
  for op in pr_rs pr_ar; do
    WORLD=1 timeout 60 bash tests/cuda/run_overlap_harness.sh none $OUT/grow_$op --inject grow --ops $op > $OUT/grow_$op.log 2>&1
    echo "inject grow $op (must be 0): rc=$? | $(grep -h 'failed growth' $OUT/grow_$op.log | head -1)"
  done
  WORLD=1 HARNESS_BIN=.build/overlap_harness_mut_grow timeout 60 bash tests/cuda/run_overlap_harness.sh none $OUT/mut_grow --inject grow --ops pr_ar > $OUT/mut_grow.log 2>&1
  echo "mutant grow pr_ar (must be nonzero): rc=$? | $(grep -h 'failed growth' $OUT/mut_grow.log | head -1)"
  for m in check groups flags break wait_wrap write_methods; do
    timeout 60 .build/peer_reduce_test $m > $OUT/peer_reduce_$m.log 2>&1; echo "peer_reduce_test $m: rc=$? | $(tail -1 $OUT/peer_reduce_$m.log)"
  done
  for m in correctness signal; do
    timeout 120 .build/gemm_test $m > $OUT/gemm_test_$m.log 2>&1; echo "gemm_test $m: rc=$? | $(tail -1 $OUT/gemm_test_$m.log)"
  done
} > $OUT/checks.txt 2>&1
left=$((LIMIT - (SECONDS - T0) - 25))
echo "left for gpu_files: $left s" >> $OUT/checks.txt
if [ $left -ge 120 ]; then
  GPU_FILES="tests/test_gpu_faults.py tests/test_gpu_harness.py" STEP_TIMEOUT=$left timeout $((left + 5)) \
    bash scripts/gpu_session.sh gpu_files > $OUT/session2.txt 2>&1
  echo "session2 rc=$?" >> $OUT/session2.txt
fi
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cat $OUT/gpu.txt; sed -n '/==== summary/,$p' $OUT/session.txt; cat $OUT/checks.txt
[ -e $OUT/session2.txt ] && sed -n '/==== summary/,$p' $OUT/session2.txt
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
