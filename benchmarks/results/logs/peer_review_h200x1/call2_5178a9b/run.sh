#!/usr/bin/env bash
# Session 26, call 2 (one GPU): GPU part 3 (peer, faults, watchdog, threads, harness, fuzz) with
# the review's fixes: the harness's watchdog-ends-a-hang and staged-mirror calls, the driver's
# kind of XLA's buffers under each allocator setting, peer_access_test through pytest.
O=$OUT; export OUT=/tmp/r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s26_run2.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
GPU_PART=3 STEP_TIMEOUT=450 timeout 500 bash scripts/gpu_session.sh build gpu_part > $OUT/session.txt 2>&1
tail -3 $OUT/session.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -8
JAX_FLASHOVERLAP_FALLBACK=0 timeout 50 python3 -m pytest -q -s -k by_kind tests/test_gpu_peer.py 2>&1 | grep -E "XLA allocator|passed|failed" | tee $OUT/xla_kinds.log
tar -czf $O/logs.tgz -C $OUT .
