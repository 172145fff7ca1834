#!/usr/bin/env bash
# Session 48, call 2 (one GPU): call 1 again with the rounds in a balanced Latin square (each
# variant in each place and after each other variant alike; call 1's rotation kept every
# variant's predecessor): epilogue_ab.py in order and reversed (20 samples: two squares of
# its 10 variants), the tile probe twice.
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
export CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
step() {  # name, timeout, command...
  local name="$1" t="$2"; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s | $(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1; echo "build rc=$?" | tee -a $OUT/summary.txt
for order in "overlap halves sync" "sync halves overlap"; do
  tag=$(echo $order | tr ' ' _)
  step ab_$tag 120 env -u FLASHOVERLAP_GEMM_EPILOGUE PYTHONPATH=. python3 benchmarks/epilogue_ab.py --samples 20 --epilogues $order --out $OUT/epilogue_ab_$tag.json
done
step tile_probe_run1 120 .build/tile_probe $OUT/tile_probe_run1.json
step tile_probe_run2 120 .build/tile_probe $OUT/tile_probe_run2.json
cat $OUT/gpu.txt
for order in overlap_halves_sync sync_halves_overlap; do echo "== $order"; grep -v "^\[flashoverlap" $OUT/ab_$order.txt | tail -7; done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for run in ("tile_probe_run1", "tile_probe_run2"):
    try: d = json.load(open(f"{out}/{run}.json"))
    except Exception as e: print(run, "unreadable", e); continue
    rows = d.get("results", d if isinstance(d, list) else [])
    by = {}
    for r in rows:
        by.setdefault((r.get("m"), r.get("n"), r.get("k")), {})[r.get("variant")] = r.get("ms")
    for shape, v in by.items():
        for base, cs in (("ours", ("ours_halves", "ours_sync_epilogue", "cublas", "cutlass_coop_128x256_2x1")),
                         ("ours_cs16", ("ours_cs16_halves", "ours_cs16_sync_epilogue"))):
            o = v.get(base)
            print(run, shape, base, " ".join(f"{c}={o / v[c]:.3f}" for c in cs if o and v.get(c)))
PY
cd $OUT && tar -czf /tmp/logs.tgz * && find . -maxdepth 1 -type f -delete && mv /tmp/logs.tgz . && ls -la
