#!/usr/bin/env bash
# Session 46, call 5 (one GPU): the tile probe (tests/cuda/tile_probe.cu), twice, with our variants.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
echo "CUBLAS_LIB=$CUBLAS_LIB" >> $OUT/gpu.txt
for r in 1 2; do
  timeout 240 .build/tile_probe $OUT/tile_probe_run$r.json > $OUT/tile_probe_run$r.txt 2>&1; echo "rc=$?" >> $OUT/tile_probe_run$r.txt
done
cat $OUT/gpu.txt; cat $OUT/tile_probe_run1.txt $OUT/tile_probe_run2.txt
