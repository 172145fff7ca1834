#!/usr/bin/env bash
# Builds .build_tl/gemm_test with FO_TIMELINE: the signaling GEMM records clock64 stamps of
# its first CTAs' warps per piece of work (`gemm_test timeline --shape MxNxK --comm C`).
# Every object is compiled with the define (it adds a field to SignalingGemmArgs).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$ROOT/.build_tl"
mkdir -p "$BUILD"
CUTLASS_DIR="${CUTLASS_DIR:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')}"
FLAGS="-std=c++17 -O3 -DNDEBUG -DFO_TIMELINE -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I$CUTLASS_DIR/include -I$CUTLASS_DIR/tools/util/include"
SRCS=(xla_ffi/kernels/signaling_gemm_*.cu xla_ffi/kernels/signaling_gemm.cu tests/cuda/gemm_test.cu)
cd "$ROOT"
printf '%s\n' "${SRCS[@]}" | xargs -P "${JOBS:-$(nproc)}" -I{} bash -c "nvcc $FLAGS -c {} -o $BUILD/\$(basename {} .cu).o"
nvcc -o "$BUILD/gemm_test" "$BUILD"/signaling_gemm*.o "$BUILD/gemm_test.o" -ldl
echo "built $BUILD/gemm_test"
