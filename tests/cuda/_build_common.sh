# Sourced by tests/cuda/build.sh and build_tile_probe.sh (after ROOT is set).
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
