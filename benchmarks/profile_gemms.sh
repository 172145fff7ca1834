#!/usr/bin/env bash
# Nsight Compute profiles of the same GEMM three ways on one GPU: our signaling GEMM
# (tests/cuda/gemm_test profile), cublasGemmEx, and the kernel XLA's dot runs through JAX
# (its autotuned choice). Full section set, clocks left alone (METHOD.md). Needs .build/gemm_test
# (tests/cuda/build.sh) and JAX with CUDA; not the package's extension (the dot is plain JAX).
#   benchmarks/profile_gemms.sh OUT_DIR [MxNxK] [COMM_SMS]
set -uo pipefail
OUT="$1"; SHAPE="${2:-8192x8192x4096}"; COMM="${3:-0}"
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
for r in "$OUT"/*.ncu-rep; do
  ncu --import "$r" --page details --print-units base > "${r%.ncu-rep}.txt" 2>&1
done
# a short comparison: kernel, duration, SM clock, tensor pipe, DRAM / L2 throughput, grid, smem
for t in "$OUT"/*.txt; do
  echo "== $(basename "$t")"
  grep -m1 -E "^  [A-Za-z_].*\(" "$t"
  grep -m12 -E "^ +(Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|Grid Size|Block Size|Cluster Size|Dynamic Shared Memory Per Block|Registers Per Thread|Achieved Occupancy) " "$t"
done
