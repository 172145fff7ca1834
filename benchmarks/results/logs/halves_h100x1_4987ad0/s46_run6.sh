#!/usr/bin/env bash
# Session 46, call 6 (one GPU): the overlapped epilogue staged in halves
# (FLASHOVERLAP_GEMM_EPILOGUE=halves) and the rebuilt default instances: the standalone checks
# on both weight layouts, the tile probe, racecheck / synccheck, the ext tests (their add /
# mirror launches take the whole-tile instances), and test_gpu.py's epilogue tests through JAX.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
step() {  # name, timeout, command...
  local name="$1" t="$2"; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s | $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}
H=(env FLASHOVERLAP_GEMM_EPILOGUE=halves)
NK=(env FLASHOVERLAP_GEMM_EPILOGUE=halves GEMM_TEST_TRANSPOSE_W=1)
step halves_correctness 100 "${H[@]}" .build/gemm_test correctness --json "$OUT/halves_correctness.json"
step default_correctness 100 .build/gemm_test correctness --json "$OUT/default_correctness.json"
step tile_probe_run1 120 .build/tile_probe $OUT/tile_probe_run1.json
step halves_signal 60 "${H[@]}" .build/gemm_test signal --json "$OUT/halves_signal.json"
step halves_nk_correctness 100 "${NK[@]}" .build/gemm_test correctness --json "$OUT/halves_nk_correctness.json"
for tool in racecheck synccheck; do
  step "halves_$tool" 120 "${H[@]}" "$SAN" --tool "$tool" --error-exitcode 3 .build/gemm_test sanitize
done
step halves_ext 90 "${H[@]}" .build/gemm_ext_test all --json "$OUT/halves_ext.json"
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=120 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; echo "build rc=$?" | tee -a $OUT/summary.txt
step jax_epilogues 120 env JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "epilogue or matmul_vs_xla"
step tile_probe_run2 120 .build/tile_probe $OUT/tile_probe_run2.json
cat $OUT/summary.txt
