#!/usr/bin/env bash
# Builds the comm layer's JAX-free test programs from the objects `setup.py build_ext` left in
# build/obj (xla_ffi/comm and xla_ffi/kernels only: they link no XLA and no Python):
# tests/cuda/overlap_harness (the overlapped ops without JAX, for compute-sanitizer),
# tests/cuda/peer_reduce_test, peer_reduce_2gpu_test and peer_reduce_ipc_test (the peer-store
# reduction, xla_ffi/comm/peer_reduce.h: ranks emulated on one GPU; rank r on GPU r; each rank
# a process of its own, buffers shared by CUDA IPC); tests/cuda/peer_access_test (which memory
# another GPU may write, xla_ffi/comm/peer_access.h, asked of the driver on one GPU);
# tests/cuda/agreement_test (the setup agreement's bound, xla_ffi/comm/agreement.h).
#   tests/cuda/build_overlap_harness.sh [BUILD_DIR]     (default: .build)
# Needs python with the nvidia-nccl wheel (headers, libnccl.so.2) and nvcc's CUDA next to it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/.build}"
mkdir -p "$BUILD"
cd "$ROOT"
NCCL="$(python3 -c "import importlib.util; print(importlib.util.find_spec('nvidia.nccl').submodule_search_locations[0])")"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
CUDA="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}"
[[ -f "$CUDA/include/cuda_runtime.h" ]] || CUDA=/usr/local/cuda
# libcudart_static.a: lib64 in NVIDIA's installers, lib in pip's toolkit and conda's (setup.py)
CUDA_LIB="$CUDA/lib64"
[[ -f "$CUDA_LIB/libcudart_static.a" ]] || CUDA_LIB="$CUDA/lib"
objs=()
for src in xla_ffi/comm/*.cc xla_ffi/comm/*.cu xla_ffi/kernels/*.cu; do
  stem="$(basename "${src%.*}")"
  found=(build/obj/"$stem".$(printf '[0-9a-f]%.0s' {1..20}).o)  # not a cut-off .partial.o
  [[ -e "${found[0]}" ]] || { echo "missing build/obj/$stem.*.o: run 'JAX_FLASHOVERLAP_BUILD_CUDA=1 python setup.py build_ext --inplace' first"; exit 1; }
  [[ ${#found[@]} -eq 1 ]] || { echo "several objects for $stem in build/obj (a carried or old cache: 'JAX_FLASHOVERLAP_BUILD_CUDA=1 python setup.py build_ext --inplace' keeps only the current ones)"; exit 1; }
  objs+=("${found[0]}")
done
# The link lists, for programs built against a changed copy of one object (tests/cuda/mutants).
printf '%s\n' "${objs[@]}" > "$BUILD/overlap_harness.objs"
g++ -std=c++17 -O2 -Wall -I"$ROOT" -I"$CUDA/include" -I"$NCCL/include" \
  -c tests/cuda/overlap_harness.cc -o "$BUILD/overlap_harness.o"
g++ -o "$BUILD/overlap_harness" "$BUILD/overlap_harness.o" "${objs[@]}" \
  -L"$CUDA_LIB" -lcudart_static -ldl -lrt -lpthread \
  -L"$NCCL/lib" -l:libnccl.so.2 -Wl,-rpath,"$NCCL/lib"
echo "built $BUILD/overlap_harness"
g++ -std=c++17 -O2 -Wall -I"$ROOT" -I"$CUDA/include" -I"$NCCL/include" \
  -c tests/cuda/agreement_test.cc -o "$BUILD/agreement_test.o"
g++ -o "$BUILD/agreement_test" "$BUILD/agreement_test.o" "${objs[@]}" \
  -L"$CUDA_LIB" -lcudart_static -ldl -lrt -lpthread \
  -L"$NCCL/lib" -l:libnccl.so.2 -Wl,-rpath,"$NCCL/lib"
echo "built $BUILD/agreement_test"
# The peer-store programs need the kernels and the stream waits / writes only (no NCCL).
pr_objs=()
for obj in "${objs[@]}"; do
  case "$(basename "$obj")" in
    signaling_gemm*|peer_reduce.*|peer_ipc*|stream_wait*|stream_write*|stream_batch*|driver_entry*) pr_objs+=("$obj") ;;
  esac
done
printf '%s\n' "${pr_objs[@]}" > "$BUILD/peer_reduce.objs"
for prog in peer_reduce_test peer_reduce_2gpu_test peer_reduce_ipc_test; do
  "$NVCC" -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I"$ROOT" -I"$NCCL/include" \
    -c tests/cuda/$prog.cu -o "$BUILD/$prog.o"
  "$NVCC" -o "$BUILD/$prog" "$BUILD/$prog.o" "${pr_objs[@]}" -ldl
  echo "built $BUILD/$prog"
done
"$NVCC" -std=c++17 -O2 -I"$ROOT" -I"$NCCL/include" -c tests/cuda/peer_access_test.cu -o "$BUILD/peer_access_test.o"
access_objs=()
for obj in "${objs[@]}"; do
  case "$(basename "$obj")" in peer_access.*|driver_entry.*) access_objs+=("$obj") ;; esac
done
"$NVCC" -o "$BUILD/peer_access_test" "$BUILD/peer_access_test.o" "${access_objs[@]}"
echo "built $BUILD/peer_access_test"
