#!/usr/bin/env bash
# Session 49, call 2 (one GPU): the C++ error-path changes (f937b4d: every handler wrapped in
# NoThrow, JoinBack / EnqueueBreakPeers try every step) built and run on a GPU: the handlers'
# own GPU tests, the fault and watchdog tests, and the JAX-free harness (injected NCCL / CUDA
# failures named and recovered from), world 1.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
GPU_FILES="tests/test_gpu.py tests/test_gpu_faults.py tests/test_gpu_watchdog.py tests/test_gpu_switch_checks.py" \
  STEP_TIMEOUT=200 timeout 540 bash scripts/gpu_session.sh build gpu_files harness > $OUT/session.txt 2>&1
echo "session rc=$?" >> $OUT/session.txt
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cat $OUT/gpu.txt; sed -n '/==== summary/,$p' $OUT/session.txt
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
