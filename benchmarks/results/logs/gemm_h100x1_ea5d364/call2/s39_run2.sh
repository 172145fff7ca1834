#!/usr/bin/env bash
# Session 39, call 2 (one H100): the signaling GEMM on an H100, which it had only run on
# through the JAX tests (session 38): gpu_session.sh's gemm_epilogue step (standalone
# correctness, signal visibility, extensions, compute-sanitizer memcheck / racecheck /
# synccheck, timing against cublasGemmEx with both epilogues, then through JAX against XLA's
# dot at comm_sms 0 / 8 / 16, both epilogues). Its files are named *_h200 by the step; they
# are renamed *_h100 here.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r2; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run2.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi -L > $OUT/gpus.txt 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu_state.txt 2>&1
STEP_TIMEOUT=150 timeout 560 bash scripts/gpu_session.sh build gemm_epilogue > $OUT/session.txt 2>&1
echo "session rc $?" >> $OUT/session.txt
for f in $OUT/gemm_h200.json $OUT/gemm_sync_epilogue_h200.json; do [ -e "$f" ] && mv "$f" "${f/_h200/_h100}"; done
echo "== summary"; cat $OUT/gpus.txt; sed -n '/==== summary/,$p' $OUT/session.txt
tar -czf $O/logs.tgz -C $OUT .
