#!/usr/bin/env bash
# Session 24, call 6 (one GPU): what staging costs (peer_reduce_ipc_test bench_staged, two
# runs), then the final binaries' checks: the IPC test (2, 3, 8 ranks, both collectives), the
# pair's check, the extension's 1-GPU peer tests and loopback harness.
O=$OUT; export OUT=/tmp/r6; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s24_run6.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
for i in 1 2; do run bench_staged_$i 150 $B/peer_reduce_ipc_test bench_staged --iters 15 --json $OUT/bench_staged_$i.json; done
tar -czf $O/logs.tgz -C $OUT .
for w in 2 3 8; do
  run ipc$w 200 $B/peer_reduce_ipc_test check --world $w --json $OUT/ipc$w.json
  echo "ipc$w PASS $(grep -c 'PASS$' $OUT/ipc$w.log) FAIL $(grep -c FAIL $OUT/ipc$w.log)"
done
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
tar -czf $O/logs.tgz -C $OUT .
GPU_FILES="tests/test_gpu_peer.py tests/test_gpu_harness.py" STEP_TIMEOUT=300 \
  bash scripts/gpu_session.sh build harness_peer gpu_files > $OUT/session.txt 2>&1
tail -3 $OUT/session.txt
for i in 1 2; do echo "== bench_staged $i"; grep -A6 "per-GPU" $OUT/bench_staged_$i.log; done
tar -czf $O/logs.tgz -C $OUT .
