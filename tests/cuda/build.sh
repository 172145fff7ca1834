#!/usr/bin/env bash
# Builds tests/cuda/gemm_test (standalone test + benchmark of the signaling GEMM), gemm_ext_test
# (its issue-#9 extensions), gemm_helpers_test (its helper launches), sm_share_probe (the GEMM on fewer SMs, vs cuBLAS) and schedule_test (host-only) with nvcc / g++.
#   tests/cuda/build.sh [BUILD_DIR]      (default: .build at the repository root)
# CUTLASS headers: $CUTLASS_DIR (the folder holding include/ and tools/util/include), else
# the nvidia-cutlass wheel's copy found through python's cutlass_library, else .cutlass/.
# KERNEL_OBJ_DIR (e.g. build/obj) reuses setup.py's kernel objects. The kernel instantiations
# compile in parallel; any ptxas C75xx warning (e.g. C7510, wgmma
# serialized) fails the build, since it means a slow kernel.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/.build}"
mkdir -p "$BUILD"
source "$ROOT/tests/cuda/_build_common.sh"
find_cutlass
NVCC="${NVCC:-nvcc}"
FLAGS=(-std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xcompiler -fPIC
       -I"$CUTLASS_DIR/include" -I"$CUTLASS_DIR/tools/util/include")
SRCS=(xla_ffi/kernels/signaling_gemm_*_*.cu  # every instantiation (signaling_gemm_<dtype>_<tile>*.cu)
      xla_ffi/kernels/signaling_gemm.cu tests/cuda/gemm_test.cu tests/cuda/gemm_ext_test.cu
      tests/cuda/gemm_helpers_test.cu tests/cuda/sm_share_probe.cu)
export NVCC BUILD ROOT KERNEL_OBJ_DIR
export FLAGS_STR="${FLAGS[*]}"
compile() {
  local src="$1" name
  name="$(basename "${src%.cu}")"
  # KERNEL_OBJ_DIR=build/obj: take the kernel objects `setup.py build_ext` made (same flags)
  # instead of compiling them again; NAME.KEY.o only (KEY: 20 hex digits), never the
  # NAME.KEY.partial.o of a compile cut off.
  if [[ -n "${KERNEL_OBJ_DIR:-}" && "$src" == xla_ffi/kernels/* ]]; then
    local found=("$ROOT/$KERNEL_OBJ_DIR/$name".$(printf '[0-9a-f]%.0s' {1..20}).o)
    if [[ -e "${found[0]}" ]]; then cp "${found[0]}" "$BUILD/$name.o"; echo "reused ${found[0]}"; return 0; fi
  fi
  nvcc_compile "$src" "$BUILD"
}
export -f compile
JOBS="${JOBS:-$(nproc)}"
printf '%s\n' "${SRCS[@]}" | xargs -P "$JOBS" -I{} bash -c 'compile {}'
$NVCC -o "$BUILD/gemm_test" "$BUILD"/signaling_gemm_*.o "$BUILD/signaling_gemm.o" "$BUILD/gemm_test.o" -ldl
echo "built $BUILD/gemm_test"
$NVCC -o "$BUILD/gemm_ext_test" "$BUILD"/signaling_gemm_*.o "$BUILD/signaling_gemm.o" "$BUILD/gemm_ext_test.o" -ldl
echo "built $BUILD/gemm_ext_test"
$NVCC -o "$BUILD/gemm_helpers_test" "$BUILD"/signaling_gemm_*.o "$BUILD/signaling_gemm.o" "$BUILD/gemm_helpers_test.o" -ldl
echo "built $BUILD/gemm_helpers_test"
$NVCC -o "$BUILD/sm_share_probe" "$BUILD"/signaling_gemm_*.o "$BUILD/signaling_gemm.o" "$BUILD/sm_share_probe.o" -ldl
echo "built $BUILD/sm_share_probe"
# Host-only schedule check (no GPU needed).
CUDA_INC="$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")/include"
[[ -f "$CUDA_INC/cuda_runtime.h" ]] || CUDA_INC=/usr/local/cuda/include  # nvcc may be a wrapper script
g++ -std=c++17 -O2 -I"$CUDA_INC" -I"$ROOT" "$ROOT/tests/cuda/schedule_test.cc" -o "$BUILD/schedule_test"
echo "built $BUILD/schedule_test"
