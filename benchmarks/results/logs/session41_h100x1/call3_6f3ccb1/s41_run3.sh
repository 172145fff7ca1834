#!/usr/bin/env bash
# Session 41, call 3 (one GPU): the remat-policy GPU test after its fix (call 2 counted one
# call under dots_saveable: jax.grad alone let XLA drop the forward's call), and the export
# GPU test again.
O=$OUT; export OUT=/tmp/s41r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s41_run3.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
STEP_TIMEOUT=100 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; tar -czf $O/logs.tgz -C $OUT .; exit 1; }
STEP_TIMEOUT=200 PYTEST_K="remat_policy_keeps or export_runs" bash scripts/gpu_session.sh gpu_k > $OUT/session_gpu.txt 2>&1
echo "== summary"; tail -3 $OUT/session_gpu.txt; grep -E '^(FAILED|ERROR)' $OUT/gpu_k.log | head; tail -2 $OUT/gpu_k.log
tar -czf $O/logs.tgz -C $OUT .
