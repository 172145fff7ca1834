#!/usr/bin/env bash
# Session 15, call 2: the remaining GPU test files, the examples and the bench subcommands at
# the review fixes (plans, configs, env vars, global views in shard_map, Flax mesh=).
O=$OUT; export OUT=/tmp/o2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=$(git rev-parse HEAD) NCCL_NVLS_ENABLE=0
nvidia-smi -L > $OUT/gpus.txt
GPU_FILES="tests/test_gpu.py tests/test_gpu_transpose_w.py tests/test_gpu_trace.py tests/test_gpu_global_view.py tests/test_gpu_examples.py tests/test_gpu_harness.py tests/test_gpu_mesh.py" \
  STEP_TIMEOUT=380 timeout 550 bash scripts/gpu_session.sh build gpu_files quickstart global_view bench_smoke > $OUT/session.txt 2>&1
tail -12 $OUT/session.txt
grep -E "^(SKIPPED|FAILED)|passed|failed" $OUT/gpu_files.log | tail -14
tail -5 $OUT/quickstart.log
tar -czf $O/logs.tgz -C $OUT .
