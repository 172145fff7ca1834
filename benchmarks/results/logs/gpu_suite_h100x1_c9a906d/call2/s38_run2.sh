#!/usr/bin/env bash
# Session 38, call 2 (one GPU, an H100 this time): GPU parts 1 and 2 at HEAD (the suite had
# run on H200s only since 6f72744); the host objects this machine compiles (its jaxlib / NCCL
# differ from the CPU machine's, so their keys do) come back for .gpu_obj.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s38r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s38_run2.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; nvidia-smi -L > $OUT/gpus.txt 2>&1
STEP_TIMEOUT=60 timeout 65 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1
mkdir -p $O/obj; for o in build/obj/*.o; do [ -e ".gpu_obj/$(basename $o)" ] || cp $o $O/obj/; done
for p in 1 2; do
  GPU_PART=$p STEP_TIMEOUT=225 timeout 230 bash scripts/gpu_session.sh gpu_part > $OUT/session_part$p.txt 2>&1
done
echo "== summary"; cat $OUT/gpus.txt; tail -1 $OUT/session_build.txt; grep -c compiled $OUT/build.log; ls $O/obj | wc -l
for p in 1 2; do tail -1 $OUT/session_part$p.txt; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part$p.log | tail -4; done
tar -czf $O/logs.tgz -C $OUT .
