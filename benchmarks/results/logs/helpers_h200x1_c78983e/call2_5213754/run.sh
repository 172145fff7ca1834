#!/usr/bin/env bash
# Session 17, call 2: the helper launches through JAX: env probe, GPU tests and fuzz with helpers, world-1 bench.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:?} NCCL_NVLS_ENABLE=0
t0=$SECONDS
bash scripts/gpu_session.sh build > $OUT/session.txt 2>&1; echo "build $((SECONDS-t0))s"; tail -1 $OUT/session.txt
export PYTHONPATH=/tmp/site:$(pwd)
t0=$SECONDS
timeout 90 python3 tmp_device/probe_env.py > $OUT/probe_env.log 2>&1; echo "probe rc=$? $((SECONDS-t0))s"; tail -5 $OUT/probe_env.log
t0=$SECONDS
FLASHOVERLAP_GEMM_HELPERS=on JAX_FLASHOVERLAP_FALLBACK=0 timeout 200 python3 -m pytest -q -ra -m "gpu or multigpu" tests/test_gpu.py tests/test_gpu_in_place.py tests/test_gpu_transpose_w.py > $OUT/gpu_tests_helpers.log 2>&1; echo "gpu tests (helpers on) rc=$? $((SECONDS-t0))s"; tail -3 $OUT/gpu_tests_helpers.log
t0=$SECONDS
timeout 130 python3 benchmarks/fuzz.py --cases 400 --seconds 90 --seed 1717 --ops all_reduce reduce_scatter --out $OUT/fuzz_helpers_h200x1.json > $OUT/fuzz.log 2>&1
echo "fuzz rc=$? $((SECONDS-t0))s"; grep -c " ok " $OUT/fuzz.log; grep " FAIL " $OUT/fuzz.log | head; tail -4 $OUT/fuzz.log
t0=$SECONDS
JAX_FLASHOVERLAP_FALLBACK=0 timeout 200 python3 -m jax_flashoverlap.bench overlap --world 1 --variants helpers --samples 10 --trace 0 --out $OUT/bench_w1_helpers.json > $OUT/bench_w1.log 2>&1; echo "bench w1 rc=$? $((SECONDS-t0))s"; grep -v "^\[" $OUT/bench_w1.log | tail -14
t0=$SECONDS
timeout 60 .build/gemm_helpers_test timeline > $OUT/helpers_timeline.log 2>&1; echo "timeline rc=$? $((SECONDS-t0))s"; cat $OUT/helpers_timeline.log | head -60
t0=$SECONDS
timeout 150 .build/gemm_helpers_test bench --iters 15 --json $OUT/helpers_bench.json > $OUT/helpers_bench.log 2>&1; echo "bench rc=$? $((SECONDS-t0))s"; grep -v "^device" $OUT/helpers_bench.log
tar -czf $O/logs.tgz -C $OUT .
