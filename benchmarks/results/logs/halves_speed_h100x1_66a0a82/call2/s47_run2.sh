#!/usr/bin/env bash
# Session 47, call 2 (one GPU, an H200 asked for): the tile probe twice (ours / ours_halves /
# ours_sync_epilogue / cuBLAS / stock CUTLASS, interleaved in one process), to set against
# call 1's H100 numbers before choosing a default epilogue.
export NCCL_NVLS_ENABLE=0
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
for i in 1 2; do
  timeout 120 .build/tile_probe $OUT/tile_probe_run$i.json > $OUT/tile_probe_run$i.txt 2>&1; echo "run$i rc=$?"
done
sed -n '/python3 - "\$OUT"/,/^PY/p' tmp_device/s47_run1.sh | sed '1d;$d' > /tmp/summ.py
python3 /tmp/summ.py "$OUT"
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
