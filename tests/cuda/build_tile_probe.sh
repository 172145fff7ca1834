#!/usr/bin/env bash
# Builds tests/cuda/tile_probe (stock CUTLASS tile shapes vs cuBLAS vs our signaling GEMM on
# one GPU; tile_probe.cu says why) with nvcc, into BUILD_DIR/tile_probe.
#   tests/cuda/build_tile_probe.sh [BUILD_DIR]      (default: .build at the repository root)
# Our kernel's objects come from BUILD_DIR (tests/cuda/build.sh puts them there; run it
# first, KERNEL_OBJ_DIR=build/obj reuses setup.py's). CUTLASS headers as in build.sh. The
# three stock instantiations compile in parallel (~60-90 s each); a ptxas C75xx warning
# (wgmma serialized) fails the build, as in build.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/.build}"
source "$ROOT/tests/cuda/_build_common.sh"
find_cutlass
ours=("$BUILD"/signaling_gemm_*.o)
[[ -e "${ours[0]}" && -e "$BUILD/signaling_gemm.o" ]] || {
  echo "our kernel objects are not in $BUILD: run tests/cuda/build.sh $BUILD first"; exit 1; }
NVCC="${NVCC:-nvcc}"
OBJ="$BUILD/tile_probe_obj"
cd "$ROOT"
ls tests/cuda/tile_probe.cu tests/cuda/tile_probe_*.cu | compile_objects "$OBJ"
# Ours: the kernel objects build.sh left in BUILD.
$NVCC -o "$BUILD/tile_probe" "${ours[@]}" "$BUILD/signaling_gemm.o" "$OBJ"/tile_probe*.o -ldl
echo "built $BUILD/tile_probe"
