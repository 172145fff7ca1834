#!/usr/bin/env bash
# Session 32, call 1 (one GPU): flag writes by the communicator's chosen method, counters taken
# under the call mutex. peer_reduce_test write_methods (and a mutant whose ChosenWriteMethod
# ignores JAX_FLASHOVERLAP_WAIT: must fail), wait_wrap, check; the JAX-free harness (world 1:
# every op, odd shape, spin waits, growth from a second thread, injected failures) with null
# counters from the caller; the peer-store harness (world 1, incl. spin waits = kernel writes);
# tests/test_gpu_switch_checks.py (the new write_method test).
O=$OUT; export OUT=/tmp/s32r1; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s32_run1.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
STEP_TIMEOUT=200 timeout 210 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; tail -1 $OUT/session_build.txt
run write_methods 40 .build/peer_reduce_test write_methods --json $OUT/write_methods.json
grep -E "write_methods" $OUT/write_methods.log | cut -c1-160
run write_methods_mutant 40 .build/peer_reduce_test_mut write_methods
grep -E "write_methods" $OUT/write_methods_mutant.log | cut -c1-160
run wait_wrap 40 .build/peer_reduce_test wait_wrap
run pr_check 120 .build/peer_reduce_test check
STEP_TIMEOUT=100 timeout 400 bash scripts/gpu_session.sh harness > $OUT/session_harness.txt 2>&1
tail -8 $OUT/session_harness.txt
STEP_TIMEOUT=60 timeout 300 bash scripts/gpu_session.sh harness_peer > $OUT/session_hpeer.txt 2>&1
tail -10 $OUT/session_hpeer.txt
run switch_checks 120 env PYTHONPATH=/tmp/site:$PWD JAX_FLASHOVERLAP_FALLBACK=0 python3 -m pytest -v -ra -o faulthandler_timeout=45 tests/test_gpu_switch_checks.py
grep -E "passed|failed|PASSED|FAILED" $OUT/switch_checks.log | tail -14
tar -czf $O/logs.tgz -C $OUT .
