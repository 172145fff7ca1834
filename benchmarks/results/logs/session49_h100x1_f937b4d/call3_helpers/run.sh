#!/usr/bin/env bash
# Session 49, call 1 (one GPU): the helper launches' standalone bench / solo three times with
# balanced rounds (session 48 ran them once on an H100); on an H200 also session 48's call 2
# (epilogue_ab.py in both orders, the tile probe twice): the H200 has not timed them balanced.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
step() {  # name, timeout, command...
  local name="$1" t="$2"; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s | $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
for run in 1 2 3; do
  step helpers_bench_$run 110 .build/gemm_helpers_test bench --iters 15 --json $OUT/helpers_bench_$run.json
  step helpers_solo_$run 80 .build/gemm_helpers_test solo --iters 15 --json $OUT/helpers_solo_$run.json
done
if grep -q H200 $OUT/gpu.txt; then
  rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
  STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; echo "build rc=$?" | tee -a $OUT/summary.txt
  for order in "overlap halves sync" "sync halves overlap"; do
    tag=$(echo $order | tr ' ' _)
    step ab_$tag 120 env -u FLASHOVERLAP_GEMM_EPILOGUE PYTHONPATH=. python3 benchmarks/epilogue_ab.py --samples 20 --epilogues $order --out $OUT/epilogue_ab_$tag.json
  done
  step tile_probe_run1 100 .build/tile_probe $OUT/tile_probe_run1.json
  step tile_probe_run2 100 .build/tile_probe $OUT/tile_probe_run2.json
  for order in overlap_halves_sync sync_halves_overlap; do echo "== $order"; grep -v "^\[flashoverlap" $OUT/ab_$order.txt | tail -7; done
fi
cat $OUT/gpu.txt
for run in 1 2 3; do grep -E "^(AR|RS) " $OUT/helpers_bench_$run.txt | awk -v r=$run '{print "bench" r, $1, $2, $4, $5, $12, $14}'; done
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
