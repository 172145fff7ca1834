#!/usr/bin/env bash
# Session 47, call 4 (one GPU): the epilogues through JAX in one process
# (benchmarks/epilogue_ab.py: the same jitted fo.matmul under FLASHOVERLAP_GEMM_EPILOGUE =
# overlap / halves / sync, interleaved rounds, XLA's dot the yardstick), the probe's per-GPU
# shapes, comm_sms 0 / 8 / 16; the launcher's geometry lines (stages) logged.
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
step ab_probe_shapes 100 python3 benchmarks/epilogue_ab.py --samples 12 --out "$OUT/epilogue_ab_probe_shapes.json"
cat $OUT/gpu.txt
grep -v "^\[flashoverlap gemm\]" $OUT/ab_probe_shapes.txt | tail -8
grep -h "^\[flashoverlap gemm\]" $OUT/ab_probe_shapes.txt | grep -o "M=[0-9]* N=[0-9]* K=[0-9]* comm_sms=[0-9]* tile [0-9x]* cluster [0-9], [0-9] stages" | sort | uniq | head -40
( cd build/obj && ls *.o | while read o; do [[ -e ../../.gpu_obj/$o ]] || echo $o; done > /tmp/newobj.txt; tar -czf $OUT/new_host_objects.tgz -T /tmp/newobj.txt ) ; echo "new objects: $(wc -l < /tmp/newobj.txt)"
cd $OUT && tar -czf /tmp/logs.tgz --exclude new_host_objects.tgz * && find . -maxdepth 1 -type f ! -name new_host_objects.tgz -delete && mv /tmp/logs.tgz . && ls -la
