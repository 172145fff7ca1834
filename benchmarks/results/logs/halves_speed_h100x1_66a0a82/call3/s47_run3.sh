#!/usr/bin/env bash
# Session 47, call 3 (one GPU): the three epilogues through JAX at the tile probe's per-GPU
# shapes (--world 1: K not halved), comm_sms 0 and 16: `bench gemm` (XLA's dot the
# yardstick in each process) with the default (overlap), halves, sync, and default again.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
step() {  # name, timeout, command...
  local name="$1" t="$2"; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s | $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; echo "build rc=$?" | tee -a $OUT/summary.txt
B=(python3 -m jax_flashoverlap.bench gemm --world 1 --comm-sms 0 16 --samples 15)
step bench_default_1 100 "${B[@]}" --out "$OUT/bench_default_1.json"
step bench_halves 100 env FLASHOVERLAP_GEMM_EPILOGUE=halves "${B[@]}" --out "$OUT/bench_halves.json"
step bench_sync 100 env FLASHOVERLAP_GEMM_EPILOGUE=sync "${B[@]}" --out "$OUT/bench_sync.json"
step bench_default_2 100 "${B[@]}" --out "$OUT/bench_default_2.json"
cat $OUT/gpu.txt
for f in bench_default_1 bench_halves bench_sync bench_default_2; do echo "== $f"; grep "xla/ours" $OUT/$f.txt; done
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
