#!/usr/bin/env bash
# Session 55, call 2 (one H100): tests/test_gpu_harness.py on the CUDA 13.5 builds of the
# JAX-free programs (HARNESS_BIN: built on the CPU machine, tmp_device/cu135/build), with the
# 13.5 module in the package. Call 1's run of the file found several objects per source in
# build/obj (the carried cache, no build step) and built no harness.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
S=$OUT/summary.txt
cp tmp_device/cu135/_xla_ffi.cpython-312-x86_64-linux-gnu.so jax_flashoverlap/
export LD_LIBRARY_PATH="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t1=$SECONDS
HARNESS_BIN=$PWD/tmp_device/cu135/build/overlap_harness timeout 400 env JAX_FLASHOVERLAP_FALLBACK=0 \
  python3 -m pytest -q -ra -p no:cacheprovider -m "gpu or multigpu" tests/test_gpu_harness.py > $OUT/harness.log 2>&1
echo "test_gpu_harness.py (13.5 programs) rc=$? $((SECONDS - t1)) s | $(tail -n 1 $OUT/harness.log)" >> $S
cat $OUT/gpu.txt $S
grep -hE "^(FAILED|ERROR|SKIPPED)" $OUT/harness.log | head -20
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && ls -la
