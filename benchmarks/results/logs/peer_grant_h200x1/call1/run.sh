#!/usr/bin/env bash
# Session 27, call 1 (one GPU): GrantPeersWrite (JAX_FLASHOVERLAP_GRANT_PEER_ACCESS): the
# driver's answers on mappings side by side (peer_access_test), then XLA's own buffers granted
# under each allocator (test_gpu_peer.py -k by_kind), then the rest of test_gpu_peer.py and the
# 1-GPU CPU-fake tests of the switch, and the harness's loopback peer calls (unchanged path).
O=$OUT; export OUT=/tmp/r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s27_run1.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
run peer_access 60 .build/peer_access_test
STEP_TIMEOUT=200 timeout 230 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -2 $OUT/session_build.txt
run by_kind 300 env JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu_peer.py -k "by_kind or staged or granted or group_of_one"
run peer_access_py 200 python3 -m pytest -q -p no:cacheprovider tests/test_peer_access.py tests/test_peer_transport.py
run hpeer 200 env WORLD=1 bash tests/cuda/run_overlap_harness.sh none $OUT/hpeer --ops pr_rs,pr_ar --calls 4
run hpeer_staged 200 env WORLD=1 bash tests/cuda/run_overlap_harness.sh none $OUT/hpeer_staged --ops pr_ar --calls 4 --stage-mirrors 1
echo "---- peer_access"; tail -22 $OUT/peer_access.log
echo "---- by_kind"; grep -E "XLA allocator|passed|failed|skipped" $OUT/by_kind.log | tail -8
tar -czf $O/logs.tgz -C $OUT .
