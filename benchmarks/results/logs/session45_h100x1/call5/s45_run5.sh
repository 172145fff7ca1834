#!/usr/bin/env bash
# Session 45, call 5 (one GPU): GPU parts 1 and 2 at COMMIT (after the Flax metadata key, the
# abstract-mesh fallback, the partitioner's device order, the bench's gpu field), and the
# flax version the machine has.
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
python3 -c "import flax, jax; print('flax', flax.__version__, 'jax', jax.__version__)" > $OUT/versions.txt 2>&1
STEP_TIMEOUT=280 GPU_PART=1 bash scripts/gpu_session.sh gpu_part > $OUT/session_gpu_part1.txt 2>&1
STEP_TIMEOUT=260 GPU_PART=2 bash scripts/gpu_session.sh gpu_part > $OUT/session_gpu_part2.txt 2>&1
echo "== summary"; cat $OUT/versions.txt; for f in $OUT/session_*.txt; do tail -n 1 $f; done; grep -hE '^(FAILED|ERROR)' $OUT/*.log | head -20
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
