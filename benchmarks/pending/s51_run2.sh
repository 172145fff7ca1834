#!/usr/bin/env bash
# Session 51, call 2 (one H200): session 48's call 2 on an H200, never run there: the three
# epilogues through JAX in one process (benchmarks/epilogue_ab.py, balanced rounds, both
# orders) and the tile probe twice; then the helper launches' standalone bench once if time is left.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
T0=$SECONDS; LIMIT=${RUN_LIMIT:-560}
step() {  # name, timeout, command...
  local name="$1" t="$2"; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s | $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; echo "build rc=$? $((SECONDS - T0)) s" | tee -a $OUT/summary.txt
for order in "overlap halves sync" "sync halves overlap"; do
  tag=$(echo $order | tr ' ' _)
  step ab_$tag 120 env -u FLASHOVERLAP_GEMM_EPILOGUE PYTHONPATH=. python3 benchmarks/epilogue_ab.py --samples 20 --epilogues $order --out $OUT/epilogue_ab_$tag.json
done
step tile_probe_run1 100 .build/tile_probe $OUT/tile_probe_run1.json
step tile_probe_run2 100 .build/tile_probe $OUT/tile_probe_run2.json
left=$((LIMIT - (SECONDS - T0) - 15))
[ $left -ge 60 ] && step helpers_bench_1 $left .build/gemm_helpers_test bench --iters 15 --json $OUT/helpers_bench_1.json
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cat $OUT/gpu.txt
for order in overlap_halves_sync sync_halves_overlap; do echo "== $order"; grep -v "^\[flashoverlap" $OUT/ab_$order.txt | tail -7; done
cat $OUT/summary.txt
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
