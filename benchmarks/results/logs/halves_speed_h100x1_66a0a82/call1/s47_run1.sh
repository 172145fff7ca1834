#!/usr/bin/env bash
# Session 47, call 1 (one GPU): the epilogue staged in halves, timed. The tile probe twice
# (ours / ours_halves / ours_sync_epilogue / cuBLAS / stock CUTLASS, interleaved in one
# process), the halves checks on the current kernels (ea1e71f's objects), then through JAX:
# `bench gemm` with the default epilogue and with FLASHOVERLAP_GEMM_EPILOGUE=halves, once each
# (XLA's dot is the yardstick inside each process). Also a planted-race negative control.
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
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
step tile_probe_run1 120 .build/tile_probe $OUT/tile_probe_run1.json
step halves_correctness 60 "${H[@]}" .build/gemm_test correctness --json "$OUT/halves_correctness.json"
step halves_nk_correctness 60 "${H[@]}" env GEMM_TEST_TRANSPOSE_W=1 .build/gemm_test correctness --json "$OUT/halves_nk_correctness.json"
step halves_signal 60 "${H[@]}" .build/gemm_test signal --json "$OUT/halves_signal.json"
step halves_racecheck 90 "${H[@]}" "$SAN" --tool racecheck --error-exitcode 3 .build/gemm_test sanitize
step halves_synccheck 90 "${H[@]}" "$SAN" --tool synccheck --error-exitcode 3 .build/gemm_test sanitize
# Negative control (tests/cuda/build_plant_race.sh): the staging_empty wait dropped in the bf16
# 128x256 overlapped instances; racecheck must now report hazards (the real binary: none).
if [[ -x .build/gemm_test_plant_race ]]; then
  step plant_racecheck_default 90 "$SAN" --tool racecheck --error-exitcode 3 .build/gemm_test_plant_race sanitize
  step plant_racecheck_halves 90 "${H[@]}" "$SAN" --tool racecheck --error-exitcode 3 .build/gemm_test_plant_race sanitize
  step plant_correctness_halves 60 "${H[@]}" .build/gemm_test_plant_race correctness
fi
step default_racecheck 90 "$SAN" --tool racecheck --error-exitcode 3 .build/gemm_test sanitize
step halves_ext 60 "${H[@]}" .build/gemm_ext_test all --json "$OUT/halves_ext.json"
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; echo "build rc=$?" | tee -a $OUT/summary.txt
B=(python3 -m jax_flashoverlap.bench gemm --comm-sms 0 16 --samples 15)
step bench_default_1 100 "${B[@]}" --out "$OUT/bench_default_1.json"
step bench_halves_1 100 "${H[@]}" "${B[@]}" --out "$OUT/bench_halves_1.json"
step tile_probe_run2 120 .build/tile_probe $OUT/tile_probe_run2.json
for f in bench_default_1 bench_halves_1; do echo "== $f"; grep "xla/ours" $OUT/$f.txt; done
python3 - "$OUT" <<'PY'
import json, sys, statistics as st
out = sys.argv[1]
for run in ("tile_probe_run1", "tile_probe_run2"):
    try: d = json.load(open(f"{out}/{run}.json"))
    except Exception as e: print(run, "unreadable", e); continue
    rows = d.get("results", d if isinstance(d, list) else [])
    by = {}
    for r in rows:
        by.setdefault((r.get("m"), r.get("n"), r.get("k")), {})[r.get("variant")] = r.get("ms")
    for shape, v in by.items():
        for base, cs in (("ours", ("ours_halves", "ours_halves_panel_32", "ours_sync_epilogue", "cublas", "cutlass_coop_128x256_2x1")),
                         ("ours_cs16", ("ours_cs16_halves", "ours_cs16_halves_panel_32", "ours_cs16_sync_epilogue"))):
            o = v.get(base)
            print(run, shape, base, " ".join(f"{c}={o / v[c]:.3f}" for c in cs if o and v.get(c)))
PY
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
