#!/usr/bin/env bash
# Session 38, call 4 (one GPU, an H100): the tests of GPU parts 1 and 2 that call 2's 225 s
# steps did not reach (tmp_device/s38_rest.txt: the files holding part 1 from its 45th test and part 2 from its 46th).
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s38r4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s38_run4.sh tmp_device/s38_rest.txt $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt; nvidia-smi -L > $OUT/gpus.txt 2>&1
STEP_TIMEOUT=60 timeout 65 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1
GPU_FILES="$(cat tmp_device/s38_rest.txt | tr '\n' ' ')" GPU_FILES_SUFFIX=_rest STEP_TIMEOUT=290 timeout 295 bash scripts/gpu_session.sh gpu_files > $OUT/session_rest.txt 2>&1
echo "== summary"; cat $OUT/gpus.txt; tail -1 $OUT/session_build.txt; grep -c compiled $OUT/build.log
tail -1 $OUT/session_rest.txt; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_files_rest.log | tail -4
tar -czf $O/logs.tgz -C $OUT .
