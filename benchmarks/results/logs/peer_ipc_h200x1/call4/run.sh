#!/usr/bin/env bash
# Session 24, call 4 (one GPU): memcheck of every rank of peer_reduce_ipc_test, one
# compute-sanitizer per rank (PEER_IPC_WRAP; call 3's single sanitizer around the parent
# printed one summary in 3 s: the ranks were not followed), 2 and 3 ranks; plain run first.
O=$OUT; export OUT=/tmp/r4; rm -rf $OUT; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
cp tmp_device/s24_run4.sh $OUT/run.sh; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
run() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log | cut -c1-150)"; }
B=.build
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
run ipc2 100 $B/peer_reduce_ipc_test check --world 2
for w in 2 3; do
  run ipc${w}_memcheck 280 env PEER_IPC_WRAP="$SAN --tool memcheck --error-exitcode 9" $B/peer_reduce_ipc_test check --world $w
  echo "memcheck $w ranks: $(grep -c 'ERROR SUMMARY' $OUT/ipc${w}_memcheck.log) summaries: $(grep 'ERROR SUMMARY' $OUT/ipc${w}_memcheck.log | sort | uniq -c | tr '\n' ' ')"
  tar -czf $O/logs.tgz -C $OUT .
done
