#!/usr/bin/env bash
# Session 27, call 2 (one GPU): grant mode asks the driver at every call (peer_access_test
# takes a grant back and checks it is granted again), then GPU part 3 (test_gpu_peer.py with
# the by-kind grants, the faults, watchdog, threads, harness and fuzz tests) at the new commit.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s27_run2.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run peer_access 60 .build/peer_access_test
GPU_PART=3 STEP_TIMEOUT=400 timeout 440 bash scripts/gpu_session.sh build gpu_part > $OUT/session.txt 2>&1
tail -3 $OUT/session.txt
echo "---- peer_access"; tail -14 $OUT/peer_access.log
echo "---- part 3"; grep -E "XLA allocator|^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -10
tar -czf $O/logs.tgz -C $OUT .
