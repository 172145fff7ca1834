# Sourced by tests/cuda/build.sh, build_tile_probe.sh and build_plant_race.sh (after ROOT is set).
#
# find_cutlass: CUTLASS_DIR as given, else the nvidia-cutlass wheel's copy (found through
# python's cutlass_library), else $ROOT/.cutlass; exits 1 when none holds the headers.
find_cutlass() {
  if [[ -z "${CUTLASS_DIR:-}" ]]; then
    CUTLASS_DIR="$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))' 2>/dev/null || true)"
    [[ -d "$CUTLASS_DIR/include/cute" ]] || CUTLASS_DIR="$ROOT/.cutlass"
  fi
  [[ -d "$CUTLASS_DIR/include/cute" ]] || { echo "CUTLASS headers not found (set CUTLASS_DIR)"; exit 1; }
}

# nvcc_compile SRC OUT_DIR compiles SRC (relative to $ROOT) into OUT_DIR/NAME.o with
# $NVCC $FLAGS_STR, its ptxas report in OUT_DIR/NAME.log. A failed compile fails it, and so
# does any ptxas C75xx warning (e.g. C7510, wgmma serialized: a slow kernel).
nvcc_compile() {
  local src="$1" out="$2" name t0=$SECONDS
  name="$(basename "${src%.cu}")"
  if ! $NVCC $FLAGS_STR -Xptxas -v -c "$ROOT/$src" -o "$out/$name.o" >"$out/$name.log" 2>&1; then
    cat "$out/$name.log"; echo "FAILED: $src"; return 1
  fi
  if grep -q "C75[0-9][0-9]" "$out/$name.log"; then
    grep "C75" "$out/$name.log"; echo "FAILED (ptxas C75xx warning): $src"; return 1
  fi
  echo "compiled $src in $((SECONDS - t0)) s"
}
export -f nvcc_compile

# compile_objects OUT_DIR [EXTRA_FLAG...] < SOURCES: nvcc_compile each source (one per line,
# relative to $ROOT) into OUT_DIR, $JOBS (default: the CPU count) at a time, with the kernels'
# device flags (find_cutlass first) and EXTRA_FLAGs; fails if any compile does.
compile_objects() {
  local out="$1"; shift
  mkdir -p "$out"
  export NVCC="${NVCC:-nvcc}" ROOT OUT_DIR="$out"
  export FLAGS_STR="-std=c++17 -O3 -DNDEBUG $* -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I$CUTLASS_DIR/include -I$CUTLASS_DIR/tools/util/include"
  (cd "$ROOT" && xargs -P "${JOBS:-$(nproc)}" -I{} bash -c 'nvcc_compile {} "$OUT_DIR"')
}
