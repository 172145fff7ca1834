#!/usr/bin/env bash
# Builds BUILD_DIR/gemm_test_plant_race: gemm_test with the bf16 128x256 overlapped instances
# (whole-tile and halves epilogues) compiled with -DFO_TEST_PLANT_RACE, which drops the
# consumers' wait for the copy-out warps to have read the staging rows (staging_empty)
# before they stage the next tile: a negative control for the checks that guard that
# hand-over,
#   timeout 90 compute-sanitizer --tool racecheck gemm_test_plant_race sanitize
#   timeout 60 env FLASHOVERLAP_GEMM_EPILOGUE=halves gemm_test_plant_race correctness
# On an H100 (session 47) racecheck reported 0 hazards for the planted whole-tile race (it
# does not see this mbarrier-ordered sharing), while sanitize's case with several tiles per
# CTA came out wrong (758 elements); the planted halves hung (its mbarrier phases fall out
# of step), hence the timeouts. Never used for anything else.
#   tests/cuda/build_plant_race.sh [BUILD_DIR]      (default: .build at the repository root)
# The other objects come from BUILD_DIR (run tests/cuda/build.sh first). CUTLASS as there.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/.build}"
source "$ROOT/tests/cuda/_build_common.sh"
find_cutlass
PLANTED=(signaling_gemm_bf16_128x256_overlap signaling_gemm_bf16_128x256_halves)
[[ -e "$BUILD/gemm_test.o" && -e "$BUILD/signaling_gemm.o" ]] || {
  echo "gemm_test's objects are not in $BUILD: run tests/cuda/build.sh $BUILD first"; exit 1; }
NVCC="${NVCC:-nvcc}"
OBJ="$BUILD/plant_race_obj"
printf 'xla_ffi/kernels/%s.cu\n' "${PLANTED[@]}" | compile_objects "$OBJ" -DFO_TEST_PLANT_RACE
objs=()
for o in "$BUILD"/signaling_gemm_*.o; do  # every instance but the planted ones' real objects
  name="$(basename "${o%.o}")"
  [[ " ${PLANTED[*]} " == *" $name "* ]] || objs+=("$o")
done
$NVCC -o "$BUILD/gemm_test_plant_race" "${objs[@]}" "$OBJ"/*.o "$BUILD/signaling_gemm.o" \
  "$BUILD/gemm_test.o" -ldl
echo "built $BUILD/gemm_test_plant_race"
