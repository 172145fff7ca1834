#!/usr/bin/env bash
# Nsight Compute profiles of the same GEMM three ways on one GPU: our signaling GEMM
# (tests/cuda/gemm_test profile), cublasGemmEx, and the kernel XLA's dot runs through JAX
# (its autotuned choice). Full section set, clocks left alone (METHOD.md). Needs .build/gemm_test
# (tests/cuda/build.sh) and JAX with CUDA; not the package's extension (the dot is plain JAX).
#   benchmarks/profile_gemms.sh OUT_DIR [MxNxK] [COMM_SMS]
set -uo pipefail
usage="usage: benchmarks/profile_gemms.sh OUT_DIR [MxNxK] [COMM_SMS]"
[ $# -ge 1 ] && [ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
OUT="$1"; SHAPE="${2:-8192x8192x4096}"; COMM="${3:-0}"
[[ "$SHAPE" =~ ^[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*$ ]] || { echo "MxNxK: three positive integers, got '$SHAPE'" >&2; exit 2; }
[[ "$COMM" =~ ^[0-9]+$ ]] || { echo "COMM_SMS: a non-negative integer, got '$COMM'" >&2; exit 2; }
command -v ncu >/dev/null || { echo "needs Nsight Compute's ncu on PATH" >&2; exit 2; }
[ -x .build/gemm_test ] || { echo "needs .build/gemm_test (tests/cuda/build.sh), run from the repository root" >&2; exit 2; }
mkdir -p "$OUT"
NCU=(ncu --clock-control none --set full --import-source no)
# ours: the 3rd of 5 launches; cuBLAS: the 3rd of its 5 (its kernel names contain one of these)
"${NCU[@]}" -k regex:SignalingGemm --launch-skip 2 --launch-count 1 -o "$OUT/ours_${SHAPE}_c${COMM}" \
  .build/gemm_test profile --shape "$SHAPE" --comm "$COMM" > "$OUT/ncu_ours.log" 2>&1
"${NCU[@]}" -k 'regex:nvjet|xmma|gemm|cutlass3x' --launch-skip 2 --launch-count 1 -o "$OUT/cublas_${SHAPE}" \
  .build/gemm_test profile --shape "$SHAPE" --comm "$COMM" > "$OUT/ncu_cublas.log" 2>&1
# XLA: compiled and autotuned first; only what runs between cuProfilerStart / Stop is profiled
"${NCU[@]}" --profile-from-start off --target-processes all --launch-skip 1 --launch-count 1 \
  -o "$OUT/xla_${SHAPE}" python benchmarks/xla_dot_profile.py "$SHAPE" > "$OUT/ncu_xla.log" 2>&1
shopt -s nullglob  # (no report: a failed profile; said below, not a file named '*.txt')
reports=("$OUT"/*.ncu-rep)
[ ${#reports[@]} -gt 0 ] || { echo "no profile was written: see $OUT/ncu_*.log" >&2; exit 1; }
for r in "${reports[@]}"; do
  ncu --import "$r" --page details --print-units base > "${r%.ncu-rep}.txt" 2>&1
done
# a short comparison: kernel, duration, SM clock, tensor pipe, DRAM / L2 throughput, grid, smem
for t in "$OUT"/*.txt; do
  echo "== $(basename "$t")"
  grep -m1 -E "^  [A-Za-z_].*\(" "$t"
  grep -m12 -E "^ +(Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|Grid Size|Block Size|Cluster Size|Dynamic Shared Memory Per Block|Registers Per Thread|Achieved Occupancy) " "$t"
done
