#!/usr/bin/env bash
# Session 39, call 3 (one H100, warm after call 2): the JAX GEMM bench twice more at comm_sms 0
# (the default epilogue; run-to-run spread, as gemm_repeat_h200 did on the H200), then
# gpu_session.sh's transpose_w step (w given as [N, K]: standalone checks, sanitizers, timing
# against the [K, N] kernel, cuBLAS and XLA's x @ w.T) on the H100.
cp -r tmp_device/clean/. . 2>/dev/null
O=$OUT; export OUT=/tmp/s39r3; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
cp tmp_device/s39_run3.sh $OUT/; echo "commit ${COMMIT:-?}" > $OUT/commit.txt
nvidia-smi -L > $OUT/gpus.txt 2>&1
STEP_TIMEOUT=100 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1 || { tail -30 $OUT/session_build.txt; exit 1; }  # installs nvidia-cutlass from .whl first
for i in 2 3; do
  timeout 120 python3 -m jax_flashoverlap.bench gemm --comm-sms 0 --out $OUT/gemm_repeat_$i.json > $OUT/gemm_repeat_$i.log 2>&1
  echo "rc $?" >> $OUT/gemm_repeat_$i.log
done
STEP_TIMEOUT=150 timeout 400 bash scripts/gpu_session.sh transpose_w > $OUT/session.txt 2>&1
echo "session rc $?" >> $OUT/session.txt
[ -e $OUT/gemm_transpose_w_h200.json ] && mv $OUT/gemm_transpose_w_h200.json $OUT/gemm_transpose_w_h100.json
echo "== summary"; for i in 2 3; do grep -E 'xla/ours|rc ' $OUT/gemm_repeat_$i.log; done
sed -n '/==== summary/,$p' $OUT/session.txt
tar -czf $O/logs.tgz -C $OUT .
