#!/usr/bin/env bash
# Session 24, call 2 (one GPU): peer stores across processes at 596bf4f (a growth now closes
# the others' mappings, a barrier, then frees). peer_reduce_ipc_test with 2, 3 and 8 ranks
# in processes of their own (the one GPU time-sliced), spin waits, memcheck of 2 ranks; the
# handler's loopback calls (harness_peer) and the 1-GPU tests of test_gpu_peer.py /
# test_gpu_harness.py on the extension built here.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s24_run2.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for w in 2 3 8; do
  run ipc$w 200 $B/peer_reduce_ipc_test check --world $w --json $OUT/ipc$w.json
  echo "ipc$w PASS $(grep -c PASS $OUT/ipc$w.log) FAIL $(grep -c FAIL $OUT/ipc$w.log)"
done
run ipc2_spin 200 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_ipc_test check --json $OUT/ipc2_spin.json
echo "ipc2_spin PASS $(grep -c PASS $OUT/ipc2_spin.log) FAIL $(grep -c FAIL $OUT/ipc2_spin.log)"
tar -czf $O/logs.tgz -C $OUT .
run ipc2_memcheck 200 "$SAN" --tool memcheck --error-exitcode 9 $B/peer_reduce_ipc_test check
grep "ERROR SUMMARY\|PASS$\|FAIL" $OUT/ipc2_memcheck.log | tail -4
tar -czf $O/logs.tgz -C $OUT .
GPU_FILES="tests/test_gpu_peer.py tests/test_gpu_harness.py" STEP_TIMEOUT=300 \
  bash scripts/gpu_session.sh build harness_peer gpu_files > $OUT/session.txt 2>&1
tail -14 $OUT/session.txt
tar -czf $O/logs.tgz -C $OUT .
