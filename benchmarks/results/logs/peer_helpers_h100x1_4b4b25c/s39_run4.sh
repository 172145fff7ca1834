#!/usr/bin/env bash
# Session 39, call 4 (one H100): the experimental peer-store transport's one-GPU checks on an
# H100 (they had run on H200s only): the harness's peer-store calls at world 1
# (harness_peer), emulated ranks on one GPU (peer_reduce_test all; groups of 3, 4, 8; spin
# waits, check then break), and the helper launches (helpers: checks, sanitizers, bench,
# timeline, the harness with helpers).
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run4.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi -L > $OUT/gpus.txt 2>&1
t0=$SECONDS
timeout 120 .build/peer_reduce_test all --json $OUT/peer_reduce.json > $OUT/peer_reduce.log 2>&1
echo "peer_reduce_test all rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/peer_reduce.log | cut -c1-120)" > $OUT/peer_reduce_rc.txt
STEP_TIMEOUT=150 timeout 440 bash scripts/gpu_session.sh build harness_peer peer_groups peer_spin helpers > $OUT/session.txt 2>&1
echo "session rc $?" >> $OUT/session.txt
echo "== summary"; cat $OUT/gpus.txt $OUT/peer_reduce_rc.txt; sed -n '/==== summary/,$p' $OUT/session.txt
tar -czf $O/logs.tgz -C $OUT .
