#!/usr/bin/env bash
# Session 24, call 3 (one GPU): peer_reduce_ipc_test with each rank exec'd (a program of its
# own), so compute-sanitizer's memcheck follows every rank (call 2's forked ranks were not
# tracked); the plain checks again on this binary.
O=$OUT; export OUT=/tmp/r3; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s24_run3.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for w in 2 8; do
  run ipc$w 200 $B/peer_reduce_ipc_test check --world $w --json $OUT/ipc$w.json
  echo "ipc$w PASS $(grep -c PASS $OUT/ipc$w.log) FAIL $(grep -c FAIL $OUT/ipc$w.log)"
done
tar -czf $O/logs.tgz -C $OUT .
run ipc2_memcheck 400 "$SAN" --tool memcheck --target-processes all --error-exitcode 9 $B/peer_reduce_ipc_test check
echo "memcheck: $(grep -c 'ERROR SUMMARY' $OUT/ipc2_memcheck.log) summaries: $(grep 'ERROR SUMMARY' $OUT/ipc2_memcheck.log | tr '\n' ' ')"
grep "PASS$\|FAIL" $OUT/ipc2_memcheck.log | tail -2
tar -czf $O/logs.tgz -C $OUT .
