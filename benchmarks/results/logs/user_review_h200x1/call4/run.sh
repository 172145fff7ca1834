#!/usr/bin/env bash
# Session 29, call 4 (one GPU): after the review of the session's commits: agreement_test
# (ConnectPeers refused once aborted), GPU part 3 (harness, faults, watchdog, peer) and part 1
# (ops, global views with the new warning, Flax, examples; the jvp now platform-dependent).
O=$OUT; export OUT=/tmp/s29r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s29_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run agreement 60 .build/agreement_test
GPU_PART=3 STEP_TIMEOUT=250 timeout 270 bash scripts/gpu_session.sh build gpu_part > $OUT/session3.txt 2>&1
tail -1 $OUT/session3.txt
GPU_PART=1 STEP_TIMEOUT=210 timeout 220 bash scripts/gpu_session.sh gpu_part > $OUT/session1.txt 2>&1
tail -1 $OUT/session1.txt
echo "---- agreement"; grep -E "ConnectPeers|ALL|FAIL" $OUT/agreement.log
for p in 3 1; do echo "---- part $p"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -4; done
tar -czf $O/logs.tgz -C $OUT .
