#!/usr/bin/env bash
# One call of docs/multi_gpu_runbook.md on the device machine (2+ GPUs), as one command:
#   COMMIT=<hash> bash scripts/runbook_call.sh A|B|C     (run's carry: .whl .gpu_obj .build)
#   A: the peer stores' standalone pair check (60 s; passed: the tune gets --peer), then tune
#   B: the benchmark against every variant (overlap_all; OVERLAP_ARGS passed on)
#   C: stress, the Flax block example, the all-to-all / all-gather bench (STRESS_ARGS, ...)
# Objects come from .gpu_obj (those the build adds come back as $OUT/obj.tgz, for .gpu_obj);
# every step records JAX_FLASHOVERLAP_GIT_COMMIT=$COMMIT (the device's git HEAD is not what
# runs). Everything ends by RUN_LIMIT seconds (default 570, under run's 600) so that the
# summary, the logs and the objects always come back: $OUT ends as logs.tgz (+ obj.tgz).
# Exit status: gpu_session.sh's (1: a step failed), 124 when RUN_LIMIT cut it, 2 for a bad
# call, 3 on a machine with fewer than 2 GPUs (nothing run).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/_gpus.sh
call="${1:-}"
case "$call" in
  A|B|C) ;;
  *) echo "usage: COMMIT=<hash> bash scripts/runbook_call.sh A|B|C (docs/multi_gpu_runbook.md)"; exit 2 ;;
esac
[ -n "${COMMIT:-}" ] || { echo "runbook_call: set COMMIT to the commit the device's tree is"; exit 2; }
LIMIT="${RUN_LIMIT:-570}"
[[ "$LIMIT" =~ ^[0-9]+$ ]] && [ "$LIMIT" -ge 20 ] || { echo "runbook_call: RUN_LIMIT=$LIMIT must be a count of seconds >= 20"; exit 2; }
OUT="${OUT:-/tmp/fo_out}"; mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
export OUT NCCL_NVLS_ENABLE=0 JAX_FLASHOVERLAP_GIT_COMMIT="$COMMIT" PYTHONUNBUFFERED=1
T0=$SECONDS
{ nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv; } > "$OUT/gpu.txt" 2>&1
gpus=$(gpu_count)
if [ "$gpus" -lt 2 ]; then
  echo "runbook_call $call: $gpus GPU(s) here, the runbook's calls need 2 or more: nothing run"
  exit 3
fi
rm -rf build/obj && mkdir -p build/obj
cp .gpu_obj/*.o build/obj/ 2>/dev/null || echo "no .gpu_obj/*.o carried: the build compiles everything" | tee -a "$OUT/summary.txt"

case "$call" in
  A)  # a hang in the peer stores' first NVLink run costs 60 s, not the tune
    if timeout $((LIMIT / 4 < 60 ? LIMIT / 4 : 60)) .build/peer_reduce_2gpu_test check --json "$OUT/pr2.json" > "$OUT/pr2.log" 2>&1; then
      export TUNE_ARGS="${TUNE_ARGS:+$TUNE_ARGS }--peer"
    fi
    echo "peer pair check: $(tail -n 1 "$OUT/pr2.log" 2>/dev/null | cut -c1-100) -> TUNE_ARGS='${TUNE_ARGS:-}'" >> "$OUT/summary.txt"
    steps=(build tune) ;;
  B) steps=(build overlap_all) ;;
  C) steps=(build stress flax_example a2a_bench) ;;
esac
# What is left after 10 s kept for packing; the steps after `build` share it less the build's
# 30 s (objects carried: the build compiles nothing), each bounded by STEP_TIMEOUT: the
# caller's, else that share (B's bench ~530 s, C's three steps ~175 s each, A's tune what
# its check left: ~470-525 s; the runbook's 480 / 540 / 180).
left=$((LIMIT - (SECONDS - T0) - 10))
share=$(( (left - 30) / (${#steps[@]} - 1) )); [ "$share" -ge 10 ] || share=10
export STEP_TIMEOUT="${STEP_TIMEOUT:-$share}"
echo "call $call: steps ${steps[*]}, $left s, STEP_TIMEOUT=$STEP_TIMEOUT" >> "$OUT/summary.txt"
if [ "$left" -ge 10 ]; then  # (timeout 0 would be no limit at all)
  timeout "$left" bash scripts/gpu_session.sh "${steps[@]}" > "$OUT/session.txt" 2>&1
  rc=$?
else
  echo "no time left for the steps (RUN_LIMIT=$LIMIT)" > "$OUT/session.txt"; rc=124
fi
{ echo "gpu_session rc=$rc after $((SECONDS - T0)) s"; sed -n '/==== summary/,$p' "$OUT/session.txt"; } >> "$OUT/summary.txt"

new=(); for o in build/obj/*.o; do [ -e "$o" ] && [ ! -e ".gpu_obj/${o##*/}" ] && new+=("${o##*/}"); done
objs="$(mktemp "${TMPDIR:-/tmp}/fo_obj.XXXXXX")"; rm -f "$objs"
[ ${#new[@]} -eq 0 ] || tar -czf "$objs" -C build/obj "${new[@]}"
cat "$OUT/gpu.txt" "$OUT/summary.txt"
logs="$(mktemp "${TMPDIR:-/tmp}/fo_logs.XXXXXX")"
# (644 as gpu_session.sh's pack makes its archive: mktemp's file is private to its owner)
tar -czf "$logs" -C "$OUT" . && chmod 644 "$logs" && find "$OUT" -mindepth 1 -delete && mv "$logs" "$OUT/logs.tgz"
[ -e "$objs" ] && chmod 644 "$objs" && mv "$objs" "$OUT/obj.tgz"
ls -la "$OUT"
exit $rc
