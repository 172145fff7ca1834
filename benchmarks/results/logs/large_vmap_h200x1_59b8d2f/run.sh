#!/usr/bin/env bash
# Session 15, call 3: outputs past 2^31 elements; the global views' vmap / shard_map guard and
# the Flax mesh= change through the GPU examples.
O=$OUT; export OUT=/tmp/o3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=$(git rev-parse HEAD) NCCL_NVLS_ENABLE=0
nvidia-smi -L > $OUT/gpus.txt
GPU_FILES="tests/test_gpu_large.py tests/test_gpu_global_view.py tests/test_gpu_examples.py" \
FLAX_ARGS="--steps 5" STEP_TIMEOUT=300 timeout 520 bash scripts/gpu_session.sh build gpu_files global_view flax_example > $OUT/session.txt 2>&1
JAX_FLASHOVERLAP_FALLBACK=0 timeout 200 python3 -m pytest -q -rA tests/test_gpu_large.py > $OUT/large_verbose.log 2>&1
tail -8 $OUT/session.txt
grep -E "^(SKIPPED|FAILED|PASSED)|passed|failed" $OUT/gpu_files.log $OUT/large_verbose.log | tail -14
tar -czf $O/logs.tgz -C $OUT .
