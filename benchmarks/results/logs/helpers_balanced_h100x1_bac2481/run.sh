#!/usr/bin/env bash
# Session 48, call 4 (one GPU): TimeInterleaved now always balanced (no flag): the helpers'
# standalone bench and solo modes and the tile probe once, as built here at that header.
export NCCL_NVLS_ENABLE=0
step() {  # name, timeout, command...
  local name="$1" t="$2"; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s | $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
step helpers_bench 110 .build/gemm_helpers_test bench --iters 15 --json $OUT/helpers_bench.json
step helpers_solo 80 .build/gemm_helpers_test solo --iters 15 --json $OUT/helpers_solo.json
step tile_probe 60 .build/tile_probe $OUT/tile_probe.json
cat $OUT/gpu.txt; grep -v "^device" $OUT/helpers_bench.txt | tail -14; tail -8 $OUT/helpers_solo.txt
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
