#!/usr/bin/env bash
# Session 51, call 2 (one H200): session 48's call 2 on an H200, never run there: the three
# epilogues through JAX in one process (gpu_session.sh's epilogue_ab: balanced rounds, in both
# orders) and the tile probe after each; then the helper launches' standalone bench once if
# time is left. Each order's logs in $OUT/<order>/ (its session.txt: the steps' summary).
export NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT=${COMMIT:-unknown}
T0=$SECONDS; LIMIT=${RUN_LIMIT:-560}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu.txt 2>&1
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
STEP_TIMEOUT=150 bash scripts/gpu_session.sh build > $OUT/session_build.txt 2>&1
echo "build rc=$? $((SECONDS - T0)) s" >> $OUT/summary.txt
for order in "overlap halves sync" "sync halves overlap"; do
  tag=$(echo $order | tr ' ' _); mkdir -p $OUT/$tag
  left=$((LIMIT - (SECONDS - T0) - 30))  # two steps of 120 s each per order pass LIMIT after a slow build
  [ $left -ge 60 ] || { echo "== $tag not run: $left s left" >> $OUT/summary.txt; continue; }
  OUT=$OUT/$tag TAG=$tag AB_ARGS="--samples 20 --epilogues $order" STEP_TIMEOUT=120 timeout $left \
    bash scripts/gpu_session.sh epilogue_ab tile_probe > $OUT/$tag/session.txt 2>&1
  { echo "== $tag rc=$?"; sed -n '/==== summary/,$p' $OUT/$tag/session.txt; } >> $OUT/summary.txt
done
left=$((LIMIT - (SECONDS - T0) - 15))
if [ $left -ge 60 ]; then
  timeout $left .build/gemm_helpers_test bench --iters 15 --json $OUT/helpers_bench_1.json > $OUT/helpers_bench_1.txt 2>&1
  echo "helpers_bench_1 rc=$? | $(tail -n 1 $OUT/helpers_bench_1.txt)" >> $OUT/summary.txt
fi
new=(); for o in build/obj/*.o; do [ -e .gpu_obj/${o##*/} ] || new+=(${o##*/}); done
[ ${#new[@]} -eq 0 ] || tar -czf /tmp/obj.tgz -C build/obj "${new[@]}"
cat $OUT/gpu.txt $OUT/summary.txt
for tag in overlap_halves_sync sync_halves_overlap; do echo "== $tag"; grep -v "^\[flashoverlap" $OUT/$tag/epilogue_ab.log | tail -7; done
cd $OUT && tar -czf /tmp/logs.tgz * && find . -mindepth 1 -delete && mv /tmp/logs.tgz . && { [ -e /tmp/obj.tgz ] && mv /tmp/obj.tgz . ; ls -la; }
