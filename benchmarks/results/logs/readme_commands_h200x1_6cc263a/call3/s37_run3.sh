#!/usr/bin/env bash
# Session 37, call 3 (one GPU): the README's main-job command on the GPU machine, then the
# bench CLI's smoke run of every subcommand (value checks included).
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s37r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s37_run3.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; nvidia-smi -L > $OUT/gpus.txt 2>&1
( time timeout 200 bash -c "bash scripts/setup_env.sh && .venv/bin/python examples/quickstart.py" ) > $OUT/quickstart.log 2>&1; echo "quickstart rc $?" >> $OUT/quickstart.log
STEP_TIMEOUT=150 timeout 160 bash scripts/gpu_session.sh bench_smoke > $OUT/session_bench.txt 2>&1
echo "== summary"; tail -12 $OUT/quickstart.log; tail -5 $OUT/session_bench.txt
tar -czf $O/logs.tgz -C $OUT .
