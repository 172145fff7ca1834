#!/usr/bin/env bash
# Runs the signaling-GEMM checks on a GPU machine (H100/H200):
#   (a) correctness, (b) signal visibility, (c) timing vs cuBLAS, (d) compute-sanitizer
#   memcheck / racecheck / synccheck on small shapes.
#   tests/cuda/run_gpu.sh [RESULT_DIR]     (default: $OUT, else .build/results)
# Uses .build/gemm_test if it exists and starts (a copy built elsewhere: static cudart),
# else builds it with tests/cuda/build.sh (needs CUTLASS headers, see there).
# cuBLAS is found through CUBLAS_LIB or searched for libcublas.so.13 under /usr and /opt.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
RES="${1:-${OUT:-$ROOT/.build/results}}"
mkdir -p "$RES"
export NCCL_NVLS_ENABLE=0
BIN="$ROOT/.build/gemm_test"
LOG="$RES/run.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1 | tee -a "$LOG"
if ! "$BIN" none >/dev/null 2>&1 || ! "$ROOT/.build/gemm_ext_test" none >/dev/null 2>&1; then
  say "prebuilt binary missing or not runnable here; building"
  "$ROOT/tests/cuda/build.sh" "$ROOT/.build" 2>&1 | tee -a "$LOG" || { say "BUILD FAILED"; exit 1; }
fi
if [[ -z "${CUBLAS_LIB:-}" ]]; then
  CUBLAS_LIB="$(find /usr /opt -name 'libcublas.so.13*' -not -name '*Lt*' 2>/dev/null | head -1)"
  export CUBLAS_LIB
fi
say "cuBLAS: ${CUBLAS_LIB:-not found}"
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$BIN" > "$RES/sass.txt" 2>/dev/null
  say "SASS: $(grep -c HGMMA "$RES/sass.txt") HGMMA, $(grep -c 'STL\|LDL' "$RES/sass.txt") local-memory ops"
  gzip -f "$RES/sass.txt"
fi

declare -A RC
step() {  # name timeout_s args...
  local name="$1" t="$2"; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" 2>&1 | tee -a "$LOG"
  RC[$name]=${PIPESTATUS[0]}
  say "== step $name: rc=${RC[$name]} ($((SECONDS - t0)) s)"
}
# Smoke test first: a hang or crash here means nothing else is worth running.
step smoke 45 "$BIN" sanitize
if [[ ${RC[smoke]} -ne 0 ]]; then say "SMOKE FAILED"; exit 1; fi
step correctness 120 "$BIN" correctness --json "$RES/correctness.json"
step signal 50 "$BIN" signal --json "$RES/signal.json"
step bench 120 "$BIN" bench --json "$RES/bench.json"
# Issue #9 extensions: row rotation, column-blocked output, input flags; host schedule check.
step schedule 60 "$ROOT/.build/schedule_test"
step ext 120 "$ROOT/.build/gemm_ext_test" all --json "$RES/ext.json"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [[ -n "$SAN" ]]; then
  for tool in memcheck racecheck synccheck; do
    step "$tool" 90 "$SAN" --tool "$tool" --error-exitcode 3 "$BIN" sanitize
  done
  step ext_memcheck 300 "$SAN" --tool memcheck --error-exitcode 3 "$ROOT/.build/gemm_ext_test" api
else
  say "compute-sanitizer not found"
fi
say "==== summary ===="
for k in smoke correctness signal bench schedule ext memcheck racecheck synccheck ext_memcheck; do say "$k: rc=${RC[$k]:-not run}"; done
grep -E "FAIL|ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK|failure\(s\)|^signal" "$LOG" | tail -40; sed -n "/==== bench/,/failure/p" "$LOG" | tail -45
# Exit 1 when a step that ran failed (the summary above says which): `cuda_tests` in
# scripts/gpu_session.sh reads this status; it was the last command's (a grep's), 0.
for k in "${!RC[@]}"; do [[ "${RC[$k]}" -eq 0 ]] || exit 1; done
exit 0
