#!/usr/bin/env bash
# Builds test programs against a deliberately broken ("mutant") copy of one comm source, to show
# that a check fails without the fix it guards (each .patch here names the fix it reverts):
#   .build/overlap_harness_mut   watchdog_abort_without_mutex.patch: the watchdog's abort goes
#                                ahead after 1 s without the call mutex (before 6d1ac36);
#                                `run_overlap_harness.sh ... --hold-mutex 5` must FAIL with it
#   .build/overlap_harness_mut_grow  peer_growth_keeps_connected.patch: a failed peer-store
#                                growth leaves its member connected (before 9fcb634);
#                                `WORLD=1 run_overlap_harness.sh ... --inject grow --ops pr_ar`
#                                must FAIL with it
#   .build/peer_reduce_test_mut  stream_write_ignores_wait_env.patch: flag writes ignore
#                                JAX_FLASHOVERLAP_WAIT; `peer_reduce_test_mut write_methods`
#                                must FAIL
# Run after tests/cuda/build_overlap_harness.sh (it needs the programs' objects and the link
# lists it leaves in .build); the patched copies compile in a temporary folder, the tree is not
# touched.
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
for need in overlap_harness.o peer_reduce_test.o overlap_harness.objs peer_reduce.objs; do
  [[ -f "$BUILD/$need" ]] || { echo "missing $BUILD/$need: run tests/cuda/build_overlap_harness.sh first"; exit 1; }
done
# mutant SOURCE PATCH: compiles the patched copy of SOURCE into $TMP/<stem>_mut.o
mutant() {
  local src="$1" patch_file="$2" stem
  stem="$(basename "${src%.*}")"
  patch -s -p1 -o "$TMP/${stem}_mut.cc" "$src" < "tests/cuda/mutants/$patch_file"
  g++ -std=c++17 -O2 -fPIC -I"$ROOT" -I"$CUDA/include" -I"$NCCL/include" -c "$TMP/${stem}_mut.cc" -o "$TMP/${stem}_mut.o"
}
# objects LIST STEM: sets objs to the link list build_overlap_harness.sh wrote, STEM's object
# replaced by the mutant's
objects() {
  local list="$1" stem="$2" obj replaced=0
  objs=()
  while read -r obj; do
    if [[ "$(basename "$obj")" == "$stem".*.o ]]; then objs+=("$TMP/${stem}_mut.o"); replaced=1; else objs+=("$obj"); fi
  done < "$BUILD/$list"
  [[ $replaced == 1 ]] || { echo "$stem is not in $BUILD/$list"; exit 1; }
}
mutant xla_ffi/comm/watchdog.cc watchdog_abort_without_mutex.patch
objects overlap_harness.objs watchdog
g++ -o "$BUILD/overlap_harness_mut" "$BUILD/overlap_harness.o" "${objs[@]}" \
  -L"$CUDA/lib64" -lcudart_static -ldl -lrt -lpthread -L"$NCCL/lib" -l:libnccl.so.2 -Wl,-rpath,"$NCCL/lib"
echo "built $BUILD/overlap_harness_mut"
mutant xla_ffi/comm/peer_stores.cc peer_growth_keeps_connected.patch
objects overlap_harness.objs peer_stores
g++ -o "$BUILD/overlap_harness_mut_grow" "$BUILD/overlap_harness.o" "${objs[@]}" \
  -L"$CUDA/lib64" -lcudart_static -ldl -lrt -lpthread -L"$NCCL/lib" -l:libnccl.so.2 -Wl,-rpath,"$NCCL/lib"
echo "built $BUILD/overlap_harness_mut_grow"
mutant xla_ffi/comm/stream_write.cc stream_write_ignores_wait_env.patch
objects peer_reduce.objs stream_write
"$NVCC" -o "$BUILD/peer_reduce_test_mut" "$BUILD/peer_reduce_test.o" "${objs[@]}" -ldl
echo "built $BUILD/peer_reduce_test_mut"
