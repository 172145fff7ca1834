#!/usr/bin/env bash
# Session 45, call 1 (one GPU): Nsight Compute, full sections, of our signaling GEMM, cublasGemmEx
# and XLA's dot at the two shapes where the H100 ran ours 3-6% behind XLA (session 39).
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
for s in 4096x8192x4096 8192x8192x4096; do
  timeout 240 bash benchmarks/profile_gemms.sh /tmp/prof_$s $s 0 > /tmp/prof_$s.summary 2>&1; echo "rc=$?" >> /tmp/prof_$s.summary
  cp /tmp/prof_$s.summary $OUT/summary_$s.txt
done
# every kernel name XLA ran (its choice of tile / cluster is in the name)
grep -h -E "nvjet|cutlass|gemm|xmma|sm90" /tmp/prof_*/ncu_xla.log | head -20 > $OUT/xla_kernels.txt
cd /tmp && tar -czf $OUT/prof_txt.tgz prof_*/*.txt prof_*/*.log
for s in 4096x8192x4096 8192x8192x4096; do tar -czf $OUT/reps_$s.tgz prof_$s/*.ncu-rep; done
ls -la $OUT
cd - >/dev/null
cat $OUT/summary_*.txt | head -120
