#!/usr/bin/env bash
# Session 25, call 2 (one GPU): the release check's rest: the GPU tests call 1's 440 s step
# did not reach (it stopped in test_gpu_transpose_w.py), and the peer-store checks run as
# processes (2 ranks) and emulated groups.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s25_run2.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run ipc2 150 .build/peer_reduce_ipc_test check --world 2 --json $OUT/ipc2.json
echo "ipc2 PASS $(grep -c 'PASS$' $OUT/ipc2.log) FAIL $(grep -c FAIL $OUT/ipc2.log)"
run pr_check 120 .build/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
GPU_FILES="tests/test_gpu_transpose_w.py tests/test_gpu_watchdog.py" STEP_TIMEOUT=300 \
  timeout 330 bash scripts/gpu_session.sh build gpu_files > $OUT/session.txt 2>&1
tail -4 $OUT/session.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_files.log | tail -5
tar -czf $O/logs.tgz -C $OUT .
