#!/usr/bin/env bash
# Session 38, call 3 (one GPU, an H100): GPU part 3 at HEAD (faults, watchdog, threads, the
# harness, fuzz: the reliability tests, on another card); the host objects this machine
# compiles come back (as one archive) for .gpu_obj.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s38r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s38_run3.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; nvidia-smi -L > $OUT/gpus.txt 2>&1
STEP_TIMEOUT=60 timeout 65 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1
new=(); for o in build/obj/*.o; do [ -e ".gpu_obj/$(basename $o)" ] || new+=("$(basename $o)"); done
[ ${#new[@]} -gt 0 ] && tar -czf $O/obj.tgz -C build/obj "${new[@]}"
GPU_PART=3 STEP_TIMEOUT=420 timeout 430 bash scripts/gpu_session.sh gpu_part > $OUT/session_part3.txt 2>&1
echo "== summary"; cat $OUT/gpus.txt; tail -1 $OUT/session_build.txt; grep -c compiled $OUT/build.log; echo "new objects ${#new[@]}"
tail -1 $OUT/session_part3.txt; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_part3.log | tail -4
tar -czf $O/logs.tgz -C $OUT .
