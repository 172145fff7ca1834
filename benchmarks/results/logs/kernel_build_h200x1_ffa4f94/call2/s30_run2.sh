#!/usr/bin/env bash
# Session 30, call 2 (one GPU): the stale-build check (call 1 ran it without the repository on
# sys.path), then GPU parts 2 and 3.
O=$OUT; export OUT=/tmp/s30r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s30_run2.sh tmp_device/s30_stale.py $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
run tune 200 python3 -m jax_flashoverlap.tune --shapes 4096x8192x8192 --collectives all_reduce reduce_scatter --comm-sms 16 --top 1 --samples 3 --calls 5 --cta-policies default --out $OUT/tune_cfg.json --report $OUT/tune_report.json
run stale 120 env PYTHONPATH=. JAX_FLASHOVERLAP_FALLBACK=0 python3 tmp_device/s30_stale.py $OUT/tune_cfg.json $OUT/stale_dir
tail -5 $OUT/stale.log
GPU_PART=2 STEP_TIMEOUT=230 timeout 240 bash scripts/gpu_session.sh gpu_part > $OUT/session2.txt 2>&1
GPU_PART=3 STEP_TIMEOUT=250 timeout 260 bash scripts/gpu_session.sh gpu_part > $OUT/session3.txt 2>&1
for p in 2 3; do echo "---- part $p"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -4; done
tar -czf $O/logs.tgz -C $OUT .
