#!/usr/bin/env bash
# Session 19, call 4 (one GPU): the tree with the peer transport wired in (handler attribute,
# peer stores on the communicator): peer_reduce_test check / sanitize (new bit criterion), the
# harness, then every GPU test (test_gpu_peer.py's 2-GPU tests skip; its 1-GPU refusal runs).
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s19_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-110)"; }
B=.build
run pr_check 150 $B/peer_reduce_test check --json $OUT/pr_check.json
echo "check PASS $(grep -c PASS $OUT/pr_check.log) FAIL $(grep -c FAIL $OUT/pr_check.log) not-compared $(grep -c 'not compared' $OUT/pr_check.log)"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
run san_racecheck 150 env FLASHOVERLAP_GEMM_TILE=256 $SAN --tool racecheck --error-exitcode 3 $B/peer_reduce_test sanitize
grep -h "SUMMARY\|flags:" $OUT/san_racecheck.log | head -3
run harness 120 env HARNESS_TIMEOUT=100 bash tests/cuda/run_overlap_harness.sh none $OUT/harness --calls 3
OUT=$OUT STEP_TIMEOUT=120 bash scripts/gpu_session.sh build info > $OUT/session_build.txt 2>&1; tail -4 $OUT/session_build.txt
OUT=$OUT STEP_TIMEOUT=${GPU_TESTS_S:-430} bash scripts/gpu_session.sh gpu_tests > $OUT/session_tests.txt 2>&1; tail -3 $OUT/session_tests.txt
tail -25 $OUT/gpu_tests.log | grep -v "^$" | tail -15
tar -czf $O/logs.tgz -C $OUT .
