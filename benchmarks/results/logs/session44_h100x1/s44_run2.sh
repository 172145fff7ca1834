#!/usr/bin/env bash
# Session 44, call 4 (one GPU): GPU part 1 at COMMIT (after the derivative and CLI commits) and
# the bench CLI's new paths on a GPU (output folder made by the writer, empty --out refused).
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
echo "commit ${COMMIT:-?}" > $OUT/bench_cli.txt
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }
export PYTHONPATH=/tmp/site:$(pwd)
timeout 120 python3 -m jax_flashoverlap.bench gemm --shapes 4096x8192x8192 --samples 5 --calls 5 --comm-sms 0 8 --out $OUT/new_folder/gemm.json >> $OUT/bench_cli.txt 2>&1; echo "bench gemm rc=$?" >> $OUT/bench_cli.txt
timeout 60 python3 -m jax_flashoverlap.bench gemm --out "" >> $OUT/bench_cli.txt 2>&1; echo "bench --out '' rc=$?" >> $OUT/bench_cli.txt
JAX_FLASHOVERLAP_TRANSPORT=pear timeout 60 python3 -m jax_flashoverlap.tune --shapes 4096x8192x8192 >> $OUT/bench_cli.txt 2>&1; echo "tune bad switch rc=$?" >> $OUT/bench_cli.txt
STEP_TIMEOUT=330 GPU_PART=1 bash scripts/gpu_session.sh gpu_part > $OUT/session_gpu_part1.txt 2>&1
echo "== summary"; tail -8 $OUT/bench_cli.txt; tail -1 $OUT/session_gpu_part1.txt; grep -hE '^(FAILED|ERROR)' $OUT/gpu_part1.log | head
