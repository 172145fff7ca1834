#!/usr/bin/env bash
# Session 24, call 8 (one GPU): the review mend (dde9fb2: one mailbox-posting step for both
# all-reduce layouts, one staged flag): the IPC test (2, 3, 8 ranks, both collectives),
# bench_staged once, the pair's check and the in-process groups (their all-reduces post
# through the merged step), the extension's 1-GPU peer tests and the loopback harness.
O=$OUT; export OUT=/tmp/r8; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s24_run8.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
for w in 2 3 8; do
  run ipc$w 200 $B/peer_reduce_ipc_test check --world $w --json $OUT/ipc$w.json
  echo "ipc$w PASS $(grep -c 'PASS$' $OUT/ipc$w.log) FAIL $(grep -c FAIL $OUT/ipc$w.log)"
done
run bench_staged 150 $B/peer_reduce_ipc_test bench_staged --iters 15 --json $OUT/bench_staged.json
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
run pr_groups 240 $B/peer_reduce_test groups --json $OUT/pr_groups.json
echo "groups PASS $(grep -c PASS $OUT/pr_groups.log) FAIL $(grep -c FAIL $OUT/pr_groups.log)"
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
tar -czf $O/logs.tgz -C $OUT .
GPU_FILES="tests/test_gpu_peer.py tests/test_gpu_harness.py" STEP_TIMEOUT=300 \
  bash scripts/gpu_session.sh build harness_peer gpu_files > $OUT/session.txt 2>&1
tail -3 $OUT/session.txt
grep -A6 "per-GPU" $OUT/bench_staged.log
tar -czf $O/logs.tgz -C $OUT .
