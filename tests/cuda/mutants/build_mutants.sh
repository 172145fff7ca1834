#!/usr/bin/env bash
# Builds test programs against a deliberately broken ("mutant") copy of one comm source, to show
# that a check fails without the fix it guards (each .patch here names the fix it reverts):
#   .build/overlap_harness_mut   watchdog_abort_without_mutex.patch: the watchdog's abort goes
#                                ahead after 1 s without the call mutex (before 6d1ac36);
#                                `run_overlap_harness.sh ... --hold-mutex 5` must FAIL with it
#   .build/peer_reduce_test_mut  stream_write_ignores_wait_env.patch: flag writes ignore
#                                JAX_FLASHOVERLAP_WAIT; `peer_reduce_test_mut write_methods`
#                                must FAIL
# Run after tests/cuda/build_overlap_harness.sh (it needs build/obj and the programs' objects
# in .build); the patched copies compile in a temporary folder, the tree is not touched.
#   tests/cuda/mutants/build_mutants.sh [BUILD_DIR]     (default: .build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
BUILD="${1:-$ROOT/.build}"
cd "$ROOT"
NCCL="$(python3 -c "import importlib.util; print(importlib.util.find_spec('nvidia.nccl').submodule_search_locations[0])")"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
CUDA="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}"
[[ -f "$CUDA/include/cuda_runtime.h" ]] || CUDA=/usr/local/cuda
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
for need in overlap_harness.o peer_reduce_test.o; do
  [[ -f "$BUILD/$need" ]] || { echo "missing $BUILD/$need: run tests/cuda/build_overlap_harness.sh first"; exit 1; }
done
# mutant SOURCE PATCH: compiles the patched copy of SOURCE into $TMP/<stem>_mut.o
mutant() {
  local src="$1" patch_file="$2" stem
  stem="$(basename "${src%.*}")"
  patch -s -p1 -o "$TMP/${stem}_mut.cc" "$src" < "tests/cuda/mutants/$patch_file"
  g++ -std=c++17 -O2 -fPIC -I"$ROOT" -I"$CUDA/include" -I"$NCCL/include" -c "$TMP/${stem}_mut.cc" -o "$TMP/${stem}_mut.o"
}
# objects OBJECT_FILTER REPLACED_STEM: build/obj's objects (those matching the filter), one replaced
objects() {
  local filter="$1" replaced="$2" stem found
  for src in xla_ffi/comm/*.cc xla_ffi/comm/*.cu xla_ffi/kernels/*.cu; do
    stem="$(basename "${src%.*}")"
    [[ "$stem" =~ $filter ]] || continue
    if [[ "$stem" == "$replaced" ]]; then echo "$TMP/${stem}_mut.o"; continue; fi
    found=(build/obj/"$stem".*.o)
    [[ -e "${found[0]}" ]] || { echo "missing build/obj/$stem.*.o" >&2; exit 1; }
    echo "${found[0]}"
  done
}
mutant xla_ffi/comm/watchdog.cc watchdog_abort_without_mutex.patch
mapfile -t objs < <(objects '.*' watchdog)
g++ -o "$BUILD/overlap_harness_mut" "$BUILD/overlap_harness.o" "${objs[@]}" \
  -L"$CUDA/lib64" -lcudart_static -ldl -lrt -lpthread -L"$NCCL/lib" -l:libnccl.so.2 -Wl,-rpath,"$NCCL/lib"
echo "built $BUILD/overlap_harness_mut"
mutant xla_ffi/comm/stream_write.cc stream_write_ignores_wait_env.patch
mapfile -t objs < <(objects '^(signaling_gemm.*|peer_reduce|peer_ipc.*|stream_wait.*|stream_write.*|stream_batch.*|driver_entry.*)$' stream_write)
"$NVCC" -o "$BUILD/peer_reduce_test_mut" "$BUILD/peer_reduce_test.o" "${objs[@]}" -ldl
echo "built $BUILD/peer_reduce_test_mut"
