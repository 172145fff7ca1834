#!/usr/bin/env bash
# Session 37, call 2 (one GPU): GPU parts 2 and 3 at HEAD (what one GPU runs of them).
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s37r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s37_run2.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; nvidia-smi -L > $OUT/gpus.txt 2>&1
STEP_TIMEOUT=60 timeout 65 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1
for p in 2 3; do
  GPU_PART=$p STEP_TIMEOUT=$([ $p = 2 ] && echo 220 || echo 290) timeout 300 bash scripts/gpu_session.sh gpu_part > $OUT/session_part$p.txt 2>&1
done
echo "== summary"; cat $OUT/gpus.txt; tail -1 $OUT/session_build.txt
for p in 2 3; do tail -1 $OUT/session_part$p.txt; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -4; done
tar -czf $O/logs.tgz -C $OUT .
