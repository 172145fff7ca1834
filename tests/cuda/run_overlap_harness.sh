#!/usr/bin/env bash
# Runs tests/cuda/overlap_harness on every GPU of this machine, one process per GPU, each
# optionally under NVIDIA compute-sanitizer.
#   tests/cuda/run_overlap_harness.sh TOOL LOGDIR [harness options...]
# TOOL: none, memcheck (every kernel: ours, NCCL's), racecheck or synccheck (the signaling
# GEMM: NCCL's kernels are not ours to judge). Per rank: LOGDIR/TOOL_r<rank>.out (the
# harness's lines) and LOGDIR/TOOL_r<rank>.log (the sanitizer's). Exit status 0 only if every
# process exited 0 (the harness matched every element; the sanitizer found nothing:
# --error-exitcode) within HARNESS_TIMEOUT seconds (default 300). WORLD overrides the count.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOOL="${1:?TOOL (none|memcheck|racecheck|synccheck)}"; LOGDIR="${2:?LOGDIR}"; shift 2
BIN="${HARNESS_BIN:-$ROOT/.build/overlap_harness}"
[[ -x "$BIN" ]] || { echo "no $BIN: run tests/cuda/build_overlap_harness.sh first"; exit 2; }
WORLD="${WORLD:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}"
[[ "$WORLD" -ge 1 ]] || { echo "no GPU found"; exit 2; }
mkdir -p "$LOGDIR"
ID="$LOGDIR/nccl_id_$TOOL"; rm -f "$ID" "$ID".peer.*
export NCCL_NVLS_ENABLE=0
pids=()
for ((r = 0; r < WORLD; r++)); do
  cmd=("$BIN" --rank "$r" --world "$WORLD" --device 0 --id-file "$ID" "$@")
  if [[ "$TOOL" != none ]]; then
    SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
    [[ -n "$SAN" ]] || { echo "compute-sanitizer not found"; exit 2; }
    san=("$SAN" --tool "$TOOL" --error-exitcode 9 --log-file "$LOGDIR/${TOOL}${SANITIZER_TAG:-}_r$r.log" ${SANITIZER_ARGS:-})
    [[ "$TOOL" == memcheck ]] || san+=(--kernel-name kns=SignalingGemm)
    cmd=("${san[@]}" "${cmd[@]}")
  fi
  CUDA_VISIBLE_DEVICES=$r timeout "${HARNESS_TIMEOUT:-300}" "${cmd[@]}" >"$LOGDIR/${TOOL}_r$r.out" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < WORLD; r++)); do
  wait "${pids[$r]}"; rc=$?
  echo "rank $r ($TOOL): exit $rc"
  [[ $rc -eq 0 ]] || status=1
  cat "$LOGDIR/${TOOL}_r$r.out"
  [[ "$TOOL" == none ]] || grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|SYNCCHECK SUMMARY\|Program hit\|error" "$LOGDIR/${TOOL}${SANITIZER_TAG:-}_r$r.log" | head -20
done
exit $status
