#!/usr/bin/env bash
# Session 24, call 1 (one GPU): peer stores across processes (cc5afcd). The reduce-scatter
# with every rank in a process of its own, buffers shared by CUDA IPC, on the one GPU by time
# slices (peer_reduce_ipc_test: 2 and 3 ranks, stream-op and spin waits); the pair's check and
# the handler's loopback calls unchanged (peer_stores.cc changed); the extension built here and
# the 1-GPU tests of test_gpu_peer.py / test_gpu_harness.py.
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s24_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
nvidia-smi --query-gpu=name,compute_mode --format=csv > $OUT/gpu.txt 2>&1
run ipc2 200 $B/peer_reduce_ipc_test check --json $OUT/ipc2.json
echo "ipc2 PASS $(grep -c PASS $OUT/ipc2.log) FAIL $(grep -c FAIL $OUT/ipc2.log)"
tar -czf $O/logs.tgz -C $OUT .
run ipc2_spin 200 env JAX_FLASHOVERLAP_WAIT=spin $B/peer_reduce_ipc_test check --json $OUT/ipc2_spin.json
echo "ipc2_spin PASS $(grep -c PASS $OUT/ipc2_spin.log) FAIL $(grep -c FAIL $OUT/ipc2_spin.log)"
run ipc3 250 $B/peer_reduce_ipc_test check --world 3 --json $OUT/ipc3.json
echo "ipc3 PASS $(grep -c PASS $OUT/ipc3.log) FAIL $(grep -c FAIL $OUT/ipc3.log)"
tar -czf $O/logs.tgz -C $OUT .
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log)"
GPU_FILES="tests/test_gpu_peer.py tests/test_gpu_harness.py" STEP_TIMEOUT=300 \
  bash scripts/gpu_session.sh build harness_peer gpu_files > $OUT/session.txt 2>&1
tail -20 $OUT/session.txt
tar -czf $O/logs.tgz -C $OUT .
