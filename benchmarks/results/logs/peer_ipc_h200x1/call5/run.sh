#!/usr/bin/env bash
# Session 24, call 5 (one GPU): the staged all-reduce across processes (fe92383). The IPC test
# (both collectives) with 2, 3 and 8 ranks in processes of their own, spin waits, a memcheck
# per rank (2 ranks); the pair's in-process check (its all-reduce unstaged, unchanged); the
# handler's loopback calls and the 1-GPU tests of test_gpu_peer.py / test_gpu_harness.py.
O=$OUT; export OUT=/tmp/r5; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s24_run5.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for w in 2 3 8; do
  run ipc$w 200 $B/peer_reduce_ipc_test check --world $w --json $OUT/ipc$w.json
  echo "ipc$w PASS $(grep -c 'PASS$' $OUT/ipc$w.log) FAIL $(grep -c FAIL $OUT/ipc$w.log) AR $(grep -c ' AR .*PASS$' $OUT/ipc$w.log)"
done
run ipc2_spin 200 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_ipc_test check --json $OUT/ipc2_spin.json
echo "ipc2_spin PASS $(grep -c 'PASS$' $OUT/ipc2_spin.log) FAIL $(grep -c FAIL $OUT/ipc2_spin.log)"
tar -czf $O/logs.tgz -C $OUT .
run ipc2_memcheck 280 env PEER_IPC_WRAP="$SAN --tool memcheck --error-exitcode 9" $B/peer_reduce_ipc_test check --world 2
echo "memcheck: $(grep 'ERROR SUMMARY' $OUT/ipc2_memcheck.log | sort | uniq -c | tr '\n' ' ') PASS $(grep -c 'PASS$' $OUT/ipc2_memcheck.log)"
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
tar -czf $O/logs.tgz -C $OUT .
GPU_FILES="tests/test_gpu_peer.py tests/test_gpu_harness.py" STEP_TIMEOUT=300 \
  bash scripts/gpu_session.sh build harness_peer gpu_files > $OUT/session.txt 2>&1
tail -14 $OUT/session.txt
tar -czf $O/logs.tgz -C $OUT .
