#!/usr/bin/env bash
# Session 28, call 3 (one GPU): the bounded abort at ef2d06c (agreement_test, and with
# --abort-never-ends: the process must exit 134 with a message), then GPU parts 3 and 1.
O=$OUT; export OUT=/tmp/s28r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s28_run3.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run agreement 120 .build/agreement_test
run abort_never_ends 90 .build/agreement_test --abort-never-ends
GPU_PART=3 STEP_TIMEOUT=260 timeout 280 bash scripts/gpu_session.sh build gpu_part > $OUT/session3.txt 2>&1
tail -2 $OUT/session3.txt
GPU_PART=1 STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh gpu_part > $OUT/session1.txt 2>&1
tail -2 $OUT/session1.txt
echo "---- abort_never_ends"; cat $OUT/abort_never_ends.log
for p in 3 1; do echo "---- part $p"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -6; done
tar -czf $O/logs.tgz -C $OUT .
