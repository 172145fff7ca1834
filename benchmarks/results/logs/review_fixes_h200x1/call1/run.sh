#!/usr/bin/env bash
# Session 28, call 1 (one GPU): the review fixes at 0a7c189 (agreement_test: a rank that never
# comes is given up after the bound, the communicator aborted, its destroy ends), creation /
# growth through it (the harness, world 1, with a growth between calls), then GPU parts 3 and 1.
O=$OUT; export OUT=/tmp/s28r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s28_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run agreement 120 .build/agreement_test
run peer_access 60 .build/peer_access_test
run harness 200 env WORLD=1 bash tests/cuda/run_overlap_harness.sh none $OUT/harness --calls 4
run harness_grow 200 env WORLD=1 bash tests/cuda/run_overlap_harness.sh none $OUT/harness_grow --ops ar,rs,pr_ar --calls 8 --grow 6
GPU_PART=3 STEP_TIMEOUT=260 timeout 280 bash scripts/gpu_session.sh build gpu_part > $OUT/session3.txt 2>&1
tail -2 $OUT/session3.txt
GPU_PART=1 STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh gpu_part > $OUT/session1.txt 2>&1
tail -2 $OUT/session1.txt
echo "---- agreement"; cat $OUT/agreement.log
for p in 3 1; do echo "---- part $p"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -6; done
tar -czf $O/logs.tgz -C $OUT .
